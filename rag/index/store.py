"""The on-disk index: FAISS for vectors, SQLite for everything else.

An index directory holds generations, each complete on its own::

    DIR/CURRENT            name of the live generation (one line)
    DIR/gen-000007/        manifest.json, vectors.faiss, chunks.sqlite
    DIR/.lock              held by the one process writing

A write builds a new generation beside the live one and publishes it by
atomically replacing ``CURRENT``, so an interrupted write leaves the previous
generation untouched and in use. Nothing is pickled: vectors go through
``faiss.write_index``, metadata through SQLite, the manifest through JSON.

Does not: read documents, chunk or embed (see ``rag.ingest``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import IndexBusy, IndexMismatch, IndexNotFound
from .lexical import LexicalIndex
from .vectors import describe, fit_vectors, new_vectors, vector_search

FORMAT_NAME = "rag-budget-index"
FORMAT_VERSION = 1
LEXICAL_FOLDER = "bm25"  # optional in a generation: rebuilt in memory when absent

_SCHEMA = """
CREATE TABLE files (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    root TEXT NOT NULL,           -- absolute path that was ingested
    source TEXT NOT NULL,         -- path relative to root, '/'-separated
    path TEXT NOT NULL,           -- absolute path of the file when read
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    n_chunks INTEGER NOT NULL,
    UNIQUE (root, source)
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- the FAISS id
    chunk_id TEXT NOT NULL UNIQUE,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    position INTEGER NOT NULL,              -- 0-based order within its file
    char_start INTEGER NOT NULL,
    char_end INTEGER NOT NULL,
    page INTEGER,
    n_tokens INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX chunks_file ON chunks(file_id);
"""


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk. ``score`` is the cosine similarity to the query."""

    chunk_id: str
    source: str
    score: float
    text: str
    page: int | None = None
    char_start: int = 0
    char_end: int = 0
    position: int = 0

    def to_dict(self) -> dict[str, object]:
        """The result object of the ``rag search --json`` contract."""
        return {
            "chunk_id": self.chunk_id,
            "source": self.source,
            "score": self.score,
            "text": self.text,
            "page": self.page,
            "char_start": self.char_start,
            "char_end": self.char_end,
        }


@dataclass(frozen=True)
class FileRecord:
    """What the index knows about one ingested file."""

    id: int
    root: str
    source: str
    sha256: str
    n_chunks: int


@dataclass(frozen=True)
class NewChunk:
    """A chunk to store, with its vector."""

    chunk_id: str
    position: int
    char_start: int
    char_end: int
    page: int | None
    n_tokens: int
    text: str


@dataclass(frozen=True)
class Manifest:
    """What an index was built with; an index is only opened by the same."""

    embedder: str
    dim: int
    chunker: dict[str, int]
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_NAME,
                "format_version": self.format_version,
                "embedder": self.embedder,
                "dim": self.dim,
                "chunker": self.chunker,
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("format") != FORMAT_NAME:
                raise ValueError("not a rag-budget manifest")
            return cls(
                embedder=str(raw["embedder"]),
                dim=int(raw["dim"]),
                chunker={str(k): int(v) for k, v in raw["chunker"].items()},
                format_version=int(raw["format_version"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IndexMismatch(
                f"{path}: unreadable index manifest ({exc}); rebuild the index with `rag ingest`"
            ) from None


def live_manifest(directory: Path) -> Manifest:
    """The manifest of the live generation of ``directory``."""
    return Manifest.read(_live_generation(Path(directory)) / "manifest.json")


def index_exists(directory: Path) -> bool:
    """Whether ``directory`` holds a published index."""
    return (directory / "CURRENT").is_file()


class Index:
    """A read-only view of the live generation of an index directory."""

    def __init__(self, directory: Path, generation: Path, manifest: Manifest, vectors, db: sqlite3.Connection):
        self.directory = directory
        self.generation = generation
        self.manifest = manifest
        self._vectors = vectors
        self._db = db
        self._lexical: LexicalIndex | None = None

    @classmethod
    def open(cls, directory: Path, *, embedder: str, dim: int) -> "Index":
        """Open the live generation of ``directory`` for reading.

        Raises IndexNotFound if there is none, IndexMismatch if it was
        written by another format version or embedding model.
        """
        import faiss

        directory = Path(directory)
        generation = _live_generation(directory)
        manifest = Manifest.read(generation / "manifest.json")
        check_manifest(manifest, directory, embedder=embedder, dim=dim)
        vectors = faiss.read_index(str(generation / "vectors.faiss"))
        db = _connect(generation / "chunks.sqlite", readonly=True)
        return cls(directory, generation, manifest, vectors, db)

    def close(self) -> None:
        """Release the database connection."""
        self._db.close()

    def __len__(self) -> int:
        return int(self._vectors.ntotal)

    def search(self, query: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` chunks whose vectors have the highest inner product with
        the unit vector ``query`` (cosine similarity), best first. Above
        ``APPROXIMATE_FROM`` vectors the search is approximate (IVF)."""
        found = self.search_ids(query, k)
        return self.hits([i for i, _ in found], query, known=dict(found))

    def search_ids(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """``(chunk id, cosine)`` of the ``k`` nearest vectors, best first."""
        if k <= 0 or len(self) == 0:
            return []
        scores, ids = vector_search(self._vectors, np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32), k)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def lexical_search(self, query: str, k: int) -> list[tuple[int, float]]:
        """``(chunk id, BM25 score)`` of up to ``k`` chunks sharing terms
        with ``query``, best first."""
        return self.lexical().search(query, k)

    def lexical(self) -> LexicalIndex:
        """The BM25 index of this generation; built in memory from the chunk
        texts when the generation has none saved (written before BM25 was)."""
        if self._lexical is None:
            try:
                self._lexical = LexicalIndex.load(self.generation / LEXICAL_FOLDER)
            except ValueError:
                rows = self._db.execute("SELECT id, text FROM chunks ORDER BY id").fetchall()
                self._lexical = LexicalIndex.build([r[0] for r in rows], [r[1] for r in rows])
        return self._lexical

    def chunks(self) -> list[tuple[int, str, str, np.ndarray]]:
        """Every chunk as ``(chunk id, source, text, unit vector)``, in id order."""
        rows = self._db.execute("SELECT id, source, text FROM chunks ORDER BY id").fetchall()
        return [(r[0], r[1], r[2], self._vectors.reconstruct(int(r[0]))) for r in rows]

    def hits(self, ids: Sequence[int], query: np.ndarray, known: dict[int, float] | None = None) -> list[Hit]:
        """The chunks ``ids`` in that order, each scored by its cosine
        similarity to ``query`` (taken from ``known`` where given)."""
        if not ids:
            return []
        known = known or {}
        rows = {
            row[0]: row
            for row in self._db.execute(
                "SELECT id, chunk_id, source, text, page, char_start, char_end, position FROM chunks "
                f"WHERE id IN ({','.join('?' * len(ids))})",
                list(ids),
            )
        }
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        result = []
        for i in ids:
            if i not in rows:
                continue
            score = known.get(i)
            if score is None:
                score = float(np.dot(self._vectors.reconstruct(int(i)), q))
            r = rows[i]
            result.append(
                Hit(chunk_id=r[1], source=r[2], score=score, text=r[3], page=r[4], char_start=r[5], char_end=r[6], position=r[7])
            )
        return result

    def files(self, root: str | None = None) -> dict[tuple[str, str], FileRecord]:
        """The ingested files, keyed by ``(root, source)``, optionally only
        those ingested from ``root``."""
        return _files(self._db, root)

    def stats(self) -> dict[str, object]:
        """Counts and sizes for ``rag doctor``."""
        n_files, n_chunks, n_tokens = self._db.execute(
            "SELECT (SELECT COUNT(*) FROM files), COUNT(*), COALESCE(SUM(n_tokens), 0) FROM chunks"
        ).fetchone()
        size = sum(p.stat().st_size for p in self.generation.rglob("*") if p.is_file())
        return {
            "path": str(self.directory),
            "files": n_files,
            "chunks": n_chunks,
            "tokens": n_tokens,
            "vectors": len(self),
            "vector_search": describe(self._vectors),
            "lexical": (self.generation / LEXICAL_FOLDER).is_dir(),
            "bytes": size,
            "embedder": self.manifest.embedder,
            "dim": self.manifest.dim,
            "chunker": self.manifest.chunker,
            "format_version": self.manifest.format_version,
        }


def check_manifest(manifest: Manifest, directory: Path, *, embedder: str, dim: int, chunker: dict[str, int] | None = None) -> None:
    """Raise IndexMismatch unless ``manifest`` matches what is asked for."""
    if manifest.format_version != FORMAT_VERSION:
        raise IndexMismatch(
            f"{directory}: index format version {manifest.format_version}, this rag-budget reads version "
            f"{FORMAT_VERSION}; rebuild it with `rag ingest PATH --index NEW_DIR` (or delete {directory})"
        )
    if manifest.embedder != embedder or manifest.dim != dim:
        raise IndexMismatch(
            f"{directory}: index built with embedder {manifest.embedder} (dim {manifest.dim}), "
            f"not {embedder} (dim {dim}); rebuild it into a new --index directory"
        )
    if chunker is not None and manifest.chunker != chunker:
        raise IndexMismatch(
            f"{directory}: index chunked with {_fmt(manifest.chunker)}, not {_fmt(chunker)}; "
            "ingest with the index's settings or into a new --index directory"
        )


def _fmt(settings: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))


class IndexWriter:
    """Changes to an index, staged in a new generation until :meth:`commit`.

    Use :func:`open_writer`; leaving its ``with`` block by an exception
    discards the staged generation and keeps the live one.
    """

    def __init__(self, directory: Path, staged: Path, manifest: Manifest, vectors, db: sqlite3.Connection,
                 live: Path | None = None):
        self.directory = directory
        self.staged = staged
        self.manifest = manifest
        self._vectors = vectors
        self._db = db
        self._live = live  # the generation this one starts from
        self._removed: list[int] = []  # chunk ids, for the BM25 index's update
        self._added: list[tuple[int, str]] = []
        self.committed = False

    def files(self, root: str | None = None) -> dict[tuple[str, str], FileRecord]:
        """The files in the staged generation, as :meth:`Index.files`."""
        return _files(self._db, root)

    def remove_file(self, file_id: int) -> None:
        """Remove a file and all of its chunks and vectors."""
        ids = [r[0] for r in self._db.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
        if ids:
            self._vectors.remove_ids(np.asarray(ids, dtype=np.int64))
            self._removed.extend(ids)
        self._db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    def vectors_by_text(self, file_id: int) -> dict[str, np.ndarray]:
        """The stored vector of each chunk text of a file."""
        rows = self._db.execute("SELECT id, text FROM chunks WHERE file_id = ?", (file_id,)).fetchall()
        return {text: self._vectors.reconstruct(int(i)) for i, text in rows}

    def add_file(
        self, *, root: str, source: str, path: str, sha256: str, size: int,
        chunks: Sequence[NewChunk], vectors: np.ndarray,
    ) -> None:
        """Add a file with its chunks and their unit vectors (one row each)."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        cur = self._db.execute(
            "INSERT INTO files (root, source, path, sha256, size, n_chunks) VALUES (?, ?, ?, ?, ?, ?)",
            (root, source, path, sha256, size, len(chunks)),
        )
        file_id = cur.lastrowid
        ids = []
        for c in chunks:
            cur = self._db.execute(
                "INSERT INTO chunks (chunk_id, file_id, source, position, char_start, char_end, page, n_tokens, text)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.chunk_id, file_id, source, c.position, c.char_start, c.char_end, c.page, c.n_tokens, c.text),
            )
            ids.append(cur.lastrowid)
            self._added.append((cur.lastrowid, c.text))
        if ids:
            self._vectors.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64)
            )

    def _lexical(self, n_chunks: int) -> LexicalIndex:
        """The BM25 index of the staged chunks: the live generation's with
        this writer's changes applied (only the added texts are read), or
        built from every chunk when there is none to start from."""
        if self._live is not None:
            try:
                base = LexicalIndex.load(self._live / LEXICAL_FOLDER)
            except ValueError:
                base = None
            if base is not None:
                removed = set(self._removed)
                added = [(i, t) for i, t in self._added if i not in removed]
                updated = base.updated(self._removed, [i for i, _ in added], [t for _, t in added])
                if len(updated) == n_chunks:
                    return updated
        rows = self._db.execute("SELECT id, text FROM chunks ORDER BY id").fetchall()
        return LexicalIndex.build([r[0] for r in rows], [r[1] for r in rows])

    def commit(self) -> None:
        """Write the staged generation durably and make it the live one."""
        import faiss

        self._db.commit()
        ids = [r[0] for r in self._db.execute("SELECT id FROM chunks ORDER BY id")]
        self._vectors = fit_vectors(self._vectors, self.manifest.dim, ids)
        lexical = self.staged / LEXICAL_FOLDER
        shutil.rmtree(lexical, ignore_errors=True)
        self._lexical(len(ids)).save(lexical)
        self._db.close()
        faiss.write_index(self._vectors, str(self.staged / "vectors.faiss"))
        (self.staged / "manifest.json").write_text(self.manifest.to_json(), encoding="utf-8")
        for name in ("vectors.faiss", "manifest.json", "chunks.sqlite"):
            _fsync_file(self.staged / name)
        for path in lexical.iterdir():
            _fsync_file(path)
        _fsync_dir(lexical)
        _fsync_dir(self.staged)
        tmp = self.directory / "CURRENT.tmp"
        tmp.write_text(self.staged.name + "\n", encoding="utf-8")
        _fsync_file(tmp)
        os.replace(tmp, self.directory / "CURRENT")
        _fsync_dir(self.directory)
        self.committed = True
        _remove_stale_generations(self.directory, keep=self.staged.name)


@contextlib.contextmanager
def open_writer(directory: Path, manifest: Manifest) -> Iterator[IndexWriter]:
    """Stage changes to the index in ``directory`` (created if missing),
    starting from a copy of its live generation.

    The caller calls ``commit()``; anything else (an exception, a crash, a
    return without commit) leaves the live generation as it was. Raises
    IndexBusy if another process is writing, IndexMismatch if the live index
    was built with other settings than ``manifest``.
    """
    import faiss

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _write_lock(directory):
        live = _live_generation(directory) if index_exists(directory) else None
        if live is not None:
            check_manifest(
                Manifest.read(live / "manifest.json"), directory,
                embedder=manifest.embedder, dim=manifest.dim, chunker=manifest.chunker,
            )
        _remove_stale_generations(directory, keep=live.name if live else None)
        staged = directory / _next_generation_name(directory)
        staged.mkdir()
        db: sqlite3.Connection | None = None
        writer: IndexWriter | None = None
        try:
            db = _connect(staged / "chunks.sqlite")
            if live is not None:
                vectors = faiss.read_index(str(live / "vectors.faiss"))
                src = _connect(live / "chunks.sqlite", readonly=True)
                src.backup(db)
                src.close()
            else:
                vectors = new_vectors(manifest.dim)
                db.executescript(_SCHEMA)
            writer = IndexWriter(directory, staged, manifest, vectors, db, live)
            yield writer
        finally:
            if writer is None or not writer.committed:
                if db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        db.close()
                shutil.rmtree(staged, ignore_errors=True)


def _live_generation(directory: Path) -> Path:
    current = directory / "CURRENT"
    try:
        name = current.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise IndexNotFound(
            f"no index at {directory}; build one with `rag ingest PATH --index {directory}`"
        ) from None
    generation = directory / name
    if not name.startswith("gen-") or not (generation / "manifest.json").is_file():
        raise IndexMismatch(f"{directory}: CURRENT names a missing generation {name!r}; rebuild the index")
    return generation


def _next_generation_name(directory: Path) -> str:
    numbers = [int(p.name[4:]) for p in directory.glob("gen-*") if p.name[4:].isdigit()]
    return f"gen-{max(numbers, default=0) + 1:06d}"


def _remove_stale_generations(directory: Path, keep: str | None) -> None:
    # Leftovers of interrupted writes and superseded generations.
    for p in directory.glob("gen-*"):
        if p.name != keep and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def _write_lock(directory: Path) -> Iterator[None]:
    with open(directory / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusy(f"{directory}: another process is writing this index; wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _connect(path: Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    else:
        db = sqlite3.connect(path, check_same_thread=False)
        db.execute("PRAGMA foreign_keys = ON")
    return db


def _files(db: sqlite3.Connection, root: str | None) -> dict[tuple[str, str], FileRecord]:
    query = "SELECT id, root, source, sha256, n_chunks FROM files"
    rows = db.execute(query + " WHERE root = ?", (root,)) if root is not None else db.execute(query)
    return {(r[1], r[2]): FileRecord(*r) for r in rows}


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
