"""Where rag-budget keeps things on disk by default, resolved when asked,
never at import.

Only the platform's own conventions are read here (``XDG_DATA_HOME``,
``XDG_CACHE_HOME``, ``XDG_RUNTIME_DIR``); rag-budget's ``RAG_*`` variables
are read once, by ``rag.settings``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def data_dir() -> Path:
    """``$XDG_DATA_HOME/rag-budget`` (``~/.local/share/rag-budget``): user data."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "rag-budget"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rag-budget`` (``~/.cache/rag-budget``): what can be rebuilt."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-budget"


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/rag-budget``, else ``/tmp/rag-budget-UID``: where
    the resident servers' sockets live (a folder only this user may enter;
    ``rag.resident.address`` checks that)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "rag-budget"
    return Path("/tmp") / f"rag-budget-{os.getuid()}"


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


def sample_index_dir(cache: Path | None = None) -> Path:
    """Where the index of the sample corpus is cached (under ``cache``,
    default :func:`cache_dir`): one per copy of the corpus, so a checkout and
    an installed wheel do not mix their files."""
    tag = hashlib.sha256(str(sample_data_dir()).encode("utf-8")).hexdigest()[:10]
    return (cache or cache_dir()) / f"sample-index-{tag}"


def is_database_url(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL database (``postgresql://`` or
    ``postgres://``) rather than a file or folder: the index and the
    conversations may each live in one."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))
