"""Where rag-budget keeps things on disk, resolved when asked, never at import."""

from __future__ import annotations

import os
from pathlib import Path


def default_index_dir() -> Path:
    """``$RAG_INDEX``, else ``$XDG_DATA_HOME/rag-budget/index``
    (``~/.local/share/rag-budget/index``)."""
    env = os.environ.get("RAG_INDEX")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "rag-budget" / "index"


def conversations_path() -> Path:
    """``$RAG_CONVERSATIONS``, else ``$XDG_DATA_HOME/rag-budget/conversations.sqlite``."""
    env = os.environ.get("RAG_CONVERSATIONS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "rag-budget" / "conversations.sqlite"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rag-budget`` (``~/.cache/rag-budget``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-budget"


def sample_data_dir() -> Path:
    """The sample corpus: ``data/`` of a source checkout, else the copy
    packed into the wheel as ``rag/sample_data``."""
    here = Path(__file__).resolve().parent
    packed = here / "sample_data"
    if packed.is_dir():
        return packed
    checkout = here.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout / "data"
    raise FileNotFoundError(f"the sample corpus is missing (looked in {packed} and {checkout / 'data'})")


def sample_index_dir() -> Path:
    """Where the index of the sample corpus is cached: one per copy of the
    corpus, so a checkout and an installed wheel do not mix their files."""
    import hashlib

    tag = hashlib.sha256(str(sample_data_dir()).encode("utf-8")).hexdigest()[:10]
    return cache_dir() / f"sample-index-{tag}"
