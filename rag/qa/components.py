"""The parts a pipeline answers with, each loaded on first use: the
embedder, the engine, the index (reopened when a new generation is
published), the conversation store, the history policy and the query-vector
cache.

Does not: answer, ingest or plan; it only builds and holds.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Literal

from engine.backend import Backend
from engine.opening import open_backend
from prompt_budget import HistoryPolicy

from .. import paths
from ..conversations import Conversations, open_store
from ..errors import IndexMismatch, IndexNotFound, engine_errors
from ..index.location import IndexLocation, index_exists, as_index_location, live_name, open_index, shown
from ..index.interface import IndexReader
from ..ingest.embed import Embedder, SentenceTransformerEmbedder
from ..ingest.library import DocumentLibrary
from ..ingest.run import ingest
from ..retrieval import QueryCache
from ..settings import Settings


class Components:
    """What a pipeline over ``index_location`` (a folder, or a PostgreSQL URL:
    see ``rag.index.location``) is made of, under ``settings``; parts given
    to the constructor are used as they are. ``kv_ram_bytes`` (default: the
    engine settings' ``snapshot_ram_bytes``) bounds the saved session KV in
    RAM, ``kv_dir`` is where it is saved on disk (``False``: nowhere)."""

    def __init__(
        self,
        settings: Settings,
        index_location: IndexLocation,
        *,
        use_sample: bool = False,
        embedder: Embedder | None = None,
        backend: Backend | None = None,
        conversations: Conversations | Path | str | None = None,
        history: HistoryPolicy | None = None,
        kv_dir: Path | None | Literal[False] = None,
        kv_ram_bytes: int | None = None,
        notice: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.settings, self.index_location, self.use_sample = settings, as_index_location(index_location), use_sample
        self._embedder, self._backend, self._store, self._history = embedder, backend, conversations, history
        self._opened_backend = False  # whether the engine was opened here (and so is closed here)
        self.kv_dir, self.kv_ram_bytes = kv_dir, kv_ram_bytes
        self.notice = notice
        self._index: IndexReader | None = None
        self._published: str | None = None  # the live generation when the index was opened (CURRENT, or the database's)
        self._queries: QueryCache | None = None
        self._lock = threading.RLock()

    @property
    def embedder(self) -> Embedder:
        """The embedding model."""
        with self._lock:
            if self._embedder is None:
                self._embedder = SentenceTransformerEmbedder()
            return self._embedder

    @property
    def backend(self) -> Backend:
        """The inference engine the settings describe."""
        with self._lock:
            if self._backend is None:
                s = self.settings
                kv_dir = None if self.kv_dir is False else (self.kv_dir or s.kv_folder)
                engine = s.engine if self.kv_ram_bytes is None else s.engine.changed(snapshot_ram_bytes=self.kv_ram_bytes)
                with engine_errors():
                    self._backend = open_backend(engine, model=s.model, snapshot_dir=kv_dir,
                                                 check_dir=s.engine_check_folder, notice=self.notice)
                self._opened_backend = True
            return self._backend

    @property
    def loaded_backend(self) -> Backend | None:
        """The engine if it is loaded (None before its first use)."""
        return self._backend

    @property
    def conversations(self) -> Conversations:
        """The conversation store (the settings' unless given): a SQLite
        file, or a PostgreSQL database named by URL."""
        with self._lock:
            if not isinstance(self._store, Conversations):
                self._store = open_store(self._store or self.settings.conversations_path)
            return self._store

    @property
    def history(self) -> HistoryPolicy:
        """When old turns are folded into the summary (default: from the context size)."""
        if self._history is None:
            self._history = HistoryPolicy.for_context(self.backend.n_ctx)
        return self._history

    @property
    def query_cache(self) -> QueryCache:
        """Query vectors already computed, by query text."""
        with self._lock:
            if self._queries is None:
                self._queries = QueryCache(self.embedder.embed)
            return self._queries

    def index(self) -> IndexReader:
        """The live index, opened once per generation; the sample corpus's
        when the pipeline answers from it (indexed on first use). A
        generation published by another process (another front-end's
        ingest) is opened at the next question: ``CURRENT`` (or a database
        index's generation number) is read each time."""
        with self._lock:
            if self._index is not None and not self.use_sample and live_name(self.index_location) != self._published:
                self._index = None  # not closed: a query already running finishes on it
            if self._index is None:
                directory = self._sample_index() if self.use_sample else self.index_location
                if not index_exists(directory):
                    raise IndexNotFound(
                        f"no index at {shown(directory)}; build one with `rag ingest PATH --index {shown(directory)}`"
                    )
                published = live_name(directory)  # read first: a later publish is then seen as new
                index = open_index(directory, embedder=self.embedder.name, dim=self.embedder.dim)
                for note in index.notes:
                    self.notice(f"index {shown(directory)}: {note}")
                index.on_note = lambda note: self.notice(f"index {shown(directory)}: {note}")
                self._index, self._published = index, published
            return self._index

    def index_changed(self) -> None:
        """A new generation was published: the next question opens it. The
        old one is not closed: a query already running finishes on it."""
        with self._lock:
            self.use_sample, self._index = False, None

    def _sample_index(self) -> Path:
        directory = paths.sample_index_dir(self.settings.cache_folder)
        # Incremental, so after the first time this only hashes a few files.
        chunker = DocumentLibrary(directory, lambda: self.embedder, lambda: None).chunker()
        try:
            ingest(directory, [paths.sample_data_dir()], embedder=self.embedder, chunker=chunker)
        except IndexMismatch:  # a cache written by another version (index format 2 before languages): built anew
            ingest(directory, [paths.sample_data_dir()], embedder=self.embedder, chunker=chunker, rebuild=True)
        return directory

    def close(self) -> None:
        """Release the index, the conversation store, and the engine if it
        was opened here (a router started for it stops with it)."""
        with self._lock:
            if self._opened_backend and self._backend is not None:
                self._backend.close()
                self._backend, self._opened_backend = None, False
            if isinstance(self._store, Conversations):
                self._store.close()
                self._store = getattr(self._store, "path", None) or getattr(self._store, "url")
            if self._index is not None:
                self._index.close()
                self._index = None
