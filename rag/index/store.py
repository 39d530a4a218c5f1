"""The on-disk index: FAISS for vectors, SQLite for everything else, BM25
beside them, in generations (see ``generations``) each complete on its own.

A write builds a new generation beside the live one and publishes it by
atomically replacing ``CURRENT``, so an interrupted write leaves the previous
generation untouched and in use. A generation found damaged (a file whose
size or checksum differs from its manifest, or that FAISS or SQLite cannot
read) is not used: the newest intact one before it answers, and says so.
Nothing is pickled: vectors go through ``faiss.write_index``, metadata
through SQLite, the manifest through JSON.

Does not: read documents, chunk or embed (see ``rag.ingest``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence
from urllib.parse import quote

import numpy as np

from ..errors import IndexBusy, IndexDamaged, IndexNotFound, RagError
from .generations import (
    choose,
    fsync_dir,
    fsync_file,
    generations,
    index_exists,
    next_name,
    problem,
    publish,
    remove_others,
    write_lock,
)
from .lexical import LexicalIndex
from .interface import (COLLECTIONS_TABLE, HIT_COLUMNS, create_collection, hit_of, keep_listed, remove_collection,
                        stats_of)
from .collection_names import DEFAULT_COLLECTION
from .records import FileRecord, Hit, NewChunk, embedded_text, lexical_text, location_json, units_json
from .manifest import Manifest, check_manifest, describe_files, sha256_of
from .vectors import describe, fit_vectors, new_vectors, vector_search

LEXICAL_FOLDER = "bm25"  # optional in a generation: rebuilt when absent or stale, and saved again
_DAMAGE = (RuntimeError, sqlite3.DatabaseError, OSError, ValueError, MemoryError)

# The files table, with each file's collection (rag.index.collection_names): an index written
# before collections is given the column by its next writer (``_with_collections``).
_FILES = """CREATE TABLE {name} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    collection TEXT NOT NULL DEFAULT 'default',
    root TEXT NOT NULL,           -- absolute path that was ingested
    source TEXT NOT NULL,         -- path relative to root, '/'-separated
    path TEXT NOT NULL,           -- absolute path of the file when read
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    n_chunks INTEGER NOT NULL,
    UNIQUE (collection, root, source)
);
"""

_SCHEMA = """
{files}CREATE TABLE chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- the FAISS id
    chunk_id TEXT NOT NULL UNIQUE,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    position INTEGER NOT NULL,              -- 0-based order within its file
    char_start INTEGER NOT NULL,
    char_end INTEGER NOT NULL,
    page INTEGER,
    n_tokens INTEGER NOT NULL,
    text TEXT NOT NULL,                     -- the chunk's own text: what prompts and sources show
    context TEXT NOT NULL DEFAULT '',       -- document title > headings above it: embedded with it (BM25: the title)
    location TEXT,                          -- JSON: page, slide, sheet and rows, chapter or lines; NULL for none
    lang TEXT NOT NULL DEFAULT 'en',        -- ISO 639-1, detected at ingest: how BM25 and the evidence read it
    units TEXT NOT NULL DEFAULT '[]'        -- JSON [start, end, kind, about] of its document's units: the evidence ranks them
);
CREATE INDEX chunks_file ON chunks(file_id);
{collections};
""".replace("{files}", _FILES.format(name="files")).replace("{collections}", COLLECTIONS_TABLE.format(name="collections"))


def live_manifest(directory: Path) -> Manifest:
    """The manifest of the generation ``directory`` answers from."""
    return Manifest.read(choose(Path(directory)).generation / "manifest.json")


class FolderIndex:
    """A read-only view of the live generation of an index directory."""

    def __init__(self, directory: Path, generation: Path, manifest: Manifest, vectors, db: sqlite3.Connection,
                 notes: Sequence[str] = ()):
        self.directory = directory
        self.generation = generation
        self.manifest = manifest
        self._vectors = vectors
        self._db = db
        self._lexical: LexicalIndex | None = None
        self._scopes: OrderedDict[object, np.ndarray] = OrderedDict()  # chunk ids in a scope, by the scope
        self.notes: list[str] = list(notes)  # what was wrong, for the user: damage, a stale BM25 folder
        self.on_note = lambda note: None  # told each note as it is found
        self._collection = _collection_column(db)
        self._counts = dict.fromkeys(_created(db), 0) | dict(
            db.execute(f"SELECT {self._collection}, COUNT(*) FROM files GROUP BY 1"))

    def _note(self, note: str) -> None:
        self.notes.append(note)
        self.on_note(note)

    @classmethod
    def open(cls, directory: Path, *, embedder: str, dim: int) -> "FolderIndex":
        """Open the generation of ``directory`` to answer from: the live one,
        or when it is damaged the newest intact one before it (``notes`` say
        so). Raises IndexNotFound if there is none, IndexMismatch if it was
        written by another format version or embedding model, IndexDamaged
        if no generation is intact."""
        directory = Path(directory)
        failed: dict[str, str] = {}
        # What a killed ingest left half-built is swept by the next writer,
        # under the lock it holds anyway (open_writer): a reader taking the
        # lock, even for an instant, makes an upload starting then IndexBusy.
        while True:
            chosen = choose(directory, skip=failed)
            manifest = Manifest.read(chosen.generation / "manifest.json")
            check_manifest(manifest, directory, embedder=embedder, dim=dim)
            try:
                vectors, db = _load(chosen.generation, manifest)
            except IndexDamaged as exc:
                failed[chosen.generation.name] = str(exc)
                continue
            return cls(directory, chosen.generation, manifest, vectors, db, chosen.notes)

    def close(self) -> None:
        """Release the database connection."""
        self._db.close()

    def __len__(self) -> int:
        return int(self._vectors.ntotal)

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
               collection: str | None = None) -> list[Hit]:
        """The ``k`` chunks whose vectors have the highest inner product with
        the unit vector ``query`` (cosine similarity), best first, among the
        chunk ids ``allowed`` (None: all) of ``collection`` (None: of any).
        Above ``APPROXIMATE_FROM`` vectors the search is approximate (IVF)."""
        found = self.search_ids(query, k, allowed, collection=collection)
        return self.hits([i for i, _ in found], query, known=dict(found))

    def search_ids(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
                   collection: str | None = None) -> list[tuple[int, float]]:
        """``(chunk id, cosine)`` of the ``k`` nearest vectors, best first,
        among the chunk ids ``allowed`` (None: all) of ``collection`` (None: of any)."""
        within = self._within(collection)
        if within is not None:
            allowed = within if allowed is None else allowed[np.isin(allowed, within)]
        if k <= 0 or len(self) == 0 or (allowed is not None and len(allowed) == 0):
            return []
        q = np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32)
        scores, ids = vector_search(self._vectors, q, k, allowed=allowed)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def lexical_search(self, query: str, k: int, allowed: np.ndarray | None = None, *,
                       collection: str | None = None) -> list[tuple[int, float]]:
        """``(chunk id, BM25 score)`` of up to ``k`` chunks sharing terms
        with ``query``, best first (ties by chunk id), among the chunk ids
        ``allowed`` (None: all) of ``collection`` (None: of any), scored by
        the statistics of ``collection``'s chunks alone (``LexicalIndex.search``;
        computed once per collection: the generation never changes)."""
        return self.lexical().search(query, k, allowed=allowed, within=self._within(collection))

    def unheard(self, words: Sequence[str], *, collection: str | None = None) -> list[str]:
        """Those of ``words`` that no chunk of ``collection`` (None: of any)
        holds (``LexicalIndex.unheard``): words its documents never use."""
        return self.lexical().unheard(words, within=self._within(collection))

    def _within(self, collection: str | None) -> np.ndarray | None:
        """The chunk ids of ``collection``, sorted; None where no filter is
        needed: no collection named, or the generation holds that one alone
        (it is one state, which no commit changes while it is open, so no
        other collection can appear in it between this and the search)."""
        if collection is None or set(self._counts) <= {collection}:
            return None
        return self.chunk_ids_of(_anything, None, collection)

    def collections(self) -> dict[str, int]:
        """The files of each collection, by its name (0: created, or emptied, and not deleted)."""
        return dict(self._counts)

    def chunk_ids_of(self, sources: Callable[[str], bool], key: object, collection: str | None = None) -> np.ndarray:
        """The ids of the chunks of every file (of ``collection``; None:
        of any) whose source ``sources`` accepts, sorted; remembered under
        ``key`` (the last 64 scopes)."""
        found = self._scopes.get((key, collection))
        if found is None:
            rows = self._db.execute(f"SELECT id, source FROM files WHERE {self._collection} = ?", (collection,)) \
                if collection is not None else self._db.execute("SELECT id, source FROM files")
            files = [i for i, source in rows if sources(source)]
            ids: list[int] = []
            for at in range(0, len(files), 500):  # SQLite bounds the parameters of one statement
                part = files[at:at + 500]
                ids += [r[0] for r in self._db.execute(
                    f"SELECT id FROM chunks WHERE file_id IN ({','.join('?' * len(part))})", part)]
            found = np.sort(np.asarray(ids, dtype=np.int64))
            self._scopes[(key, collection)] = found
            while len(self._scopes) > 64:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end((key, collection))
        return found

    def lexical(self) -> LexicalIndex:
        """The BM25 index of this generation; built from the chunk texts
        when the generation has none, or one that does not hold exactly its
        chunks (a note says so), and then saved into the generation (see
        :meth:`_save_lexical`), so the next open reads it."""
        if self._lexical is None:
            ids = np.array([r[0] for r in self._db.execute("SELECT id FROM chunks ORDER BY id")], dtype=np.int64)
            try:
                stale = self._lexical_problem()
                if stale:
                    raise ValueError(stale)
                loaded = LexicalIndex.load(self.generation / LEXICAL_FOLDER)
                if not np.array_equal(np.sort(loaded.chunk_ids), ids):
                    self._note(f"{self.generation.name}/{LEXICAL_FOLDER} does not match the index's chunks "
                               f"({len(loaded)} rows for {len(ids)} chunks); BM25 rebuilt in memory")
                    loaded = None
            except ValueError as exc:
                if (self.generation / LEXICAL_FOLDER).is_dir() and self.manifest.files:
                    self._note(f"{self.generation.name}/{LEXICAL_FOLDER} is not usable ({exc}); BM25 rebuilt in memory")
                loaded = None  # missing, damaged, or written in an older format
            if loaded is None:
                loaded = _lexical_of(self._db)
                self._save_lexical(loaded)
            self._lexical = loaded
        return self._lexical

    def _save_lexical(self, built: LexicalIndex) -> None:
        """Save ``built`` as this generation's BM25 folder and record its
        files in the manifest, under the index's write lock: the folder is
        written aside and renamed in, then the manifest replaced in one
        step (a reader in between finds them differ and builds its own).
        Skipped, with a note, while another process writes the index or
        where this one may not write."""
        generation, folder = self.generation, self.generation / LEXICAL_FOLDER
        fresh = generation / f"{LEXICAL_FOLDER}.{os.getpid()}.new"
        old = generation / f"{LEXICAL_FOLDER}.{os.getpid()}.old"
        try:
            with write_lock(self.directory):
                if not (generation / "manifest.json").is_file():
                    return  # removed meanwhile (no longer kept to fall back to)
                shutil.rmtree(fresh, ignore_errors=True)
                built.save(fresh)
                names = sorted(p.name for p in fresh.iterdir())
                for name in names:
                    fsync_file(fresh / name)
                fsync_dir(fresh)
                facts = {f"{LEXICAL_FOLDER}/{name}": {"bytes": (fresh / name).stat().st_size,
                                                       "sha256": sha256_of(fresh / name)} for name in names}
                if folder.exists():
                    os.replace(folder, old)
                os.replace(fresh, folder)
                kept = {n: f for n, f in self.manifest.files.items() if not n.startswith(f"{LEXICAL_FOLDER}/")}
                manifest = replace(self.manifest, files=kept | facts)
                tmp = generation / "manifest.json.tmp"
                tmp.write_text(manifest.to_json(), encoding="utf-8")
                fsync_file(tmp)
                os.replace(tmp, generation / "manifest.json")
                fsync_dir(generation)
                shutil.rmtree(old, ignore_errors=True)
                self.manifest = manifest
        except (IndexBusy, IndexDamaged, OSError) as exc:
            shutil.rmtree(fresh, ignore_errors=True)
            self._note(f"{generation.name}/{LEXICAL_FOLDER} was not saved again ({exc}); it is rebuilt in memory "
                       "at each start until the next ingest")

    def _lexical_problem(self) -> str | None:
        """What differs between the BM25 files and the manifest (None if nothing)."""
        for name, facts in self.manifest.files.items():
            if name.startswith(f"{LEXICAL_FOLDER}/"):
                path = self.generation / name
                if not path.is_file() or path.stat().st_size != facts.get("bytes") or \
                        sha256_of(path) != facts.get("sha256"):
                    return f"{name} differs from the manifest"
        return None

    def chunks(self) -> list[tuple[int, str, str, np.ndarray, str]]:
        """Every chunk as ``(chunk id, source, text, unit vector, context)``,
        in id order; the vector is of :func:`embedded_text` of context and text."""
        rows = self._db.execute("SELECT id, source, text, context FROM chunks ORDER BY id").fetchall()
        return [(r[0], r[1], r[2], self._vectors.reconstruct(int(r[0])), r[3]) for r in rows]

    def passages(self) -> list[tuple[str, str, int | None, str]]:
        """Every chunk as a prompt shows it: ``(source, text, page, collection)``, in id order."""
        return [tuple(r) for r in self._db.execute(
            f"SELECT c.source, c.text, c.page, {self._collection} FROM chunks c JOIN files f ON f.id = c.file_id "
            "ORDER BY c.id")]

    def hits(self, ids: Sequence[int], query: np.ndarray, known: dict[int, float] | None = None) -> list[Hit]:
        """The chunks ``ids`` in that order, each scored by its cosine
        similarity to ``query`` (taken from ``known`` where given)."""
        if not ids:
            return []
        known = known or {}
        rows = {
            row[0]: row
            for row in self._db.execute(
                f"SELECT c.id, {HIT_COLUMNS} FROM chunks c JOIN files f ON f.id = c.file_id "
                f"WHERE c.id IN ({','.join('?' * len(ids))})",
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
            result.append(hit_of(rows[i][1:], score))
        return result

    def files(self, root: str | None = None, collection: str = DEFAULT_COLLECTION) -> dict[tuple[str, str], FileRecord]:
        """The ingested files of ``collection``, keyed by ``(root, source)``,
        optionally only those ingested from ``root``."""
        return _files(self._db, root, collection, self._collection)

    def stats(self) -> dict[str, object]:
        """Counts and sizes for ``rag doctor``."""
        n_files, n_chunks, n_tokens = self._db.execute(
            "SELECT (SELECT COUNT(*) FROM files), COUNT(*), COALESCE(SUM(n_tokens), 0) FROM chunks"
        ).fetchone()
        size = sum(p.stat().st_size for p in self.generation.rglob("*") if p.is_file())
        languages = dict(self._db.execute("SELECT lang, COUNT(*) FROM chunks GROUP BY lang ORDER BY lang"))
        return stats_of(self, files=n_files, chunks=n_chunks, tokens=n_tokens, vectors=len(self),
                        vector_search=describe(self._vectors), lexical=(self.generation / LEXICAL_FOLDER).is_dir(),
                        size=size, languages=languages, collections=self.collections())


class FolderWriter:
    """Changes to an index, staged in a new generation until :meth:`commit`.

    Use :func:`open_writer`; leaving its ``with`` block by an exception
    discards the staged generation and keeps the live one.
    """

    def __init__(self, directory: Path, staged: Path, manifest: Manifest, vectors, db: sqlite3.Connection,
                 live: Path | None = None, collection: str = DEFAULT_COLLECTION):
        self.directory = directory
        self.collection = collection  # the one collection it reads and changes
        self.staged = staged
        self.manifest = manifest
        self._vectors = vectors
        self._db = db
        self._live = live  # the generation this one starts from
        self.notes: list[str] = []  # what was wrong with the index it started from
        self._removed: list[int] = []  # chunk ids, for the BM25 index's update
        self._added: list[tuple[int, str, str]] = []  # chunk id, BM25 text, language
        self.committed = False

    def files(self, root: str | None = None) -> dict[tuple[str, str], FileRecord]:
        """The files of its collection in the staged generation, as :meth:`FolderIndex.files`."""
        return _files(self._db, root, self.collection)

    def exists(self) -> bool:
        """Whether its collection is there: recorded, or holding files."""
        return self._db.execute("SELECT EXISTS (SELECT 1 FROM collections WHERE name = ?) OR EXISTS "
                                "(SELECT 1 FROM files WHERE collection = ?)", (self.collection,) * 2).fetchone()[0] == 1

    def record(self, kept: bool) -> None:
        """Record its collection (``kept``), or forget the record."""
        self._db.execute("INSERT OR IGNORE INTO collections (name) VALUES (?)" if kept else
                         "DELETE FROM collections WHERE name = ?", (self.collection,))

    def create_collection(self) -> bool:
        """See :func:`interface.create_collection`."""
        return create_collection(self)

    def remove_collection(self) -> int | None:
        """See :func:`interface.remove_collection`."""
        return remove_collection(self)

    def remove_file(self, file_id: int) -> None:
        """Remove a file and all of its chunks and vectors."""
        ids = [r[0] for r in self._db.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
        if ids:
            self._vectors.remove_ids(np.asarray(ids, dtype=np.int64))
            self._removed.extend(ids)
        self._db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    def vectors_by_text(self, file_id: int) -> dict[str, np.ndarray]:
        """The stored vector of each chunk of a file, by what it was
        embedded as (:func:`embedded_text`)."""
        rows = self._db.execute("SELECT id, context, text FROM chunks WHERE file_id = ?", (file_id,)).fetchall()
        return {embedded_text(context, text): self._vectors.reconstruct(int(i)) for i, context, text in rows}

    def add_file(
        self, *, root: str, source: str, path: str, sha256: str, size: int,
        chunks: Sequence[NewChunk], vectors: np.ndarray,
    ) -> None:
        """Add a file with its chunks and their unit vectors (one row each)."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        cur = self._db.execute(
            "INSERT INTO files (collection, root, source, path, sha256, size, n_chunks) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.collection, root, source, path, sha256, size, len(chunks)),
        )
        file_id = cur.lastrowid
        keep_listed(self)
        ids = []
        for c in chunks:
            cur = self._db.execute(
                "INSERT INTO chunks (chunk_id, file_id, source, position, char_start, char_end, page, n_tokens, text,"
                " context, location, lang, units) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.chunk_id, file_id, source, c.position, c.char_start, c.char_end, c.page, c.n_tokens, c.text,
                 c.context, location_json(c.location), c.lang, units_json(c.units)),
            )
            ids.append(cur.lastrowid)
            self._added.append((cur.lastrowid, c.lexical, c.lang))
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
                added = [(i, t, lang) for i, t, lang in self._added if i not in removed]
                updated = base.updated(self._removed, [a[0] for a in added], [a[1] for a in added],
                                       [a[2] for a in added])
                if len(updated) == n_chunks:
                    return updated
        return _lexical_of(self._db)

    def commit(self) -> None:
        """Write the staged generation durably, with the size and checksum of
        each file in its manifest, and make it the live one; the generation
        it started from is kept to fall back to."""
        import faiss

        self._db.commit()
        ids = [r[0] for r in self._db.execute("SELECT id FROM chunks ORDER BY id")]
        self._vectors = fit_vectors(self._vectors, self.manifest.dim, ids)
        lexical = self.staged / LEXICAL_FOLDER
        shutil.rmtree(lexical, ignore_errors=True)
        self._lexical(len(ids)).save(lexical)
        self._db.close()
        faiss.write_index(self._vectors, str(self.staged / "vectors.faiss"))
        names = ["vectors.faiss", "chunks.sqlite"] + sorted(f"{LEXICAL_FOLDER}/{p.name}" for p in lexical.iterdir())
        for name in names:
            fsync_file(self.staged / name)
        manifest = Manifest(self.manifest.embedder, self.manifest.dim, self.manifest.chunker,
                            chunks=len(ids), files=describe_files(self.staged, names))
        (self.staged / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")
        fsync_file(self.staged / "manifest.json")
        fsync_dir(lexical)
        fsync_dir(self.staged)
        publish(self.directory, self.staged)
        self.committed = True
        remove_others(self.directory, keep={self.staged.name} | ({self._live.name} if self._live else set()))


@contextlib.contextmanager
def open_writer(directory: Path, manifest: Manifest, *, fresh: bool = False,
                collection: str = DEFAULT_COLLECTION) -> Iterator[FolderWriter]:
    """Stage changes to ``collection`` of the index in ``directory``
    (created if missing), starting from a copy of the generation it answers
    from (or, ``fresh``, from an empty index: refused with a RagError while
    the live one holds other collections, which it would drop).

    The caller calls ``commit()``; anything else (an exception, a crash, a
    return without commit) leaves the live generation as it was. Raises
    IndexBusy if another process is writing, IndexMismatch if the live index
    was built with other settings than ``manifest``, IndexDamaged if no
    generation is intact (``fresh`` rebuilds it).
    """
    import faiss

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with write_lock(directory):
        chosen = choose(directory) if index_exists(directory) and not fresh else None
        live = chosen.generation if chosen else None
        if live is not None:
            check_manifest(Manifest.read(live / "manifest.json"), directory,
                           embedder=manifest.embedder, dim=manifest.dim, chunker=manifest.chunker)
        if fresh:
            _refuse_dropping_others(directory, collection)
        # Leftovers of interrupted writes go; the live one and the one kept to fall back to stay.
        keep = {g.name for g in generations(directory)[:2] if problem(g, full=False) is None}
        remove_others(directory, keep=keep | ({live.name} if live else set()))
        staged = directory / next_name(directory)
        staged.mkdir()
        db: sqlite3.Connection | None = None
        writer: FolderWriter | None = None
        try:
            db = _connect(staged / "chunks.sqlite")
            if live is not None:
                try:
                    vectors = faiss.read_index(str(live / "vectors.faiss"))
                    src = _connect(live / "chunks.sqlite", readonly=True)
                    src.backup(db)
                    src.close()
                    _with_collections(db)
                except _DAMAGE as exc:
                    raise IndexDamaged(f"{live}: cannot be read ({exc}); rebuild the index with "
                                       f"`rag ingest --rebuild PATH --index {directory}`") from None
            else:
                vectors = new_vectors(manifest.dim)
                db.executescript(_SCHEMA)
            writer = FolderWriter(directory, staged, manifest, vectors, db, live, collection)
            writer.notes.extend(chosen.notes if chosen else ())
            yield writer
        finally:
            if writer is None or not writer.committed:
                if db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        db.close()
                shutil.rmtree(staged, ignore_errors=True)


def _load(generation: Path, manifest: Manifest):
    """The vectors and the database of ``generation``; IndexDamaged naming
    the file that FAISS or SQLite cannot read, or that disagree."""
    import faiss

    try:
        vectors = faiss.read_index(str(generation / "vectors.faiss"))
    except _DAMAGE as exc:
        raise IndexDamaged(f"{generation.name}/vectors.faiss cannot be read ({_one_line(exc)})") from None
    try:
        db = _connect(generation / "chunks.sqlite", readonly=True)
        (count,) = db.execute("SELECT COUNT(*) FROM chunks").fetchone()
    except _DAMAGE as exc:
        raise IndexDamaged(f"{generation.name}/chunks.sqlite cannot be read ({_one_line(exc)})") from None
    if count != vectors.ntotal or (manifest.chunks is not None and count != manifest.chunks):
        db.close()
        raise IndexDamaged(f"{generation.name}: {vectors.ntotal} vectors for {count} chunks")
    return vectors, db


def _anything(source: str) -> bool:
    return True


def _lexical_of(db: sqlite3.Connection) -> LexicalIndex:
    """The BM25 index of every chunk in ``db``, each in its language."""
    rows = db.execute("SELECT id, context, text, lang FROM chunks ORDER BY id").fetchall()
    return LexicalIndex.build([r[0] for r in rows], [lexical_text(r[1], r[2]) for r in rows], [r[3] for r in rows])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160]


def _connect(path: Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False)
    else:
        db = sqlite3.connect(path, check_same_thread=False)
        db.execute("PRAGMA foreign_keys = ON")
    return db


def _files(db: sqlite3.Connection, root: str | None, collection: str,
           column: str = "collection") -> dict[tuple[str, str], FileRecord]:
    query = f"SELECT id, root, source, sha256, n_chunks FROM files WHERE {column} = ?"
    rows = db.execute(query + " AND root = ?", (collection, root)) if root is not None else \
        db.execute(query, (collection,))
    return {(r[1], r[2]): FileRecord(*r) for r in rows}


def _collection_column(db: sqlite3.Connection) -> str:
    """What names a file's collection in ``db``'s queries: its column, or
    for an index written before collections, the default collection."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(files)")}
    return "collection" if "collection" in columns else f"'{DEFAULT_COLLECTION}'"


def _has_collections_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'collections'").fetchone() is not None


def _created(db: sqlite3.Connection) -> list[str]:
    """The collections recorded in ``db`` (none in an index written before they were)."""
    if not _has_collections_table(db):
        return []
    return [name for (name,) in db.execute("SELECT name FROM collections")]


def _with_collections(db: sqlite3.Connection) -> None:
    """Give an index written before collections their table and its files
    their column: the files table is made again with it (SQLite cannot
    change a UNIQUE constraint in place), every file in the default
    collection, ids kept."""
    new_table = not _has_collections_table(db)
    db.execute(COLLECTIONS_TABLE.format(name="collections"))
    if _collection_column(db) == "collection":
        if new_table:  # the named collections its files hold, kept once emptied as any other
            db.execute("INSERT OR IGNORE INTO collections (name) SELECT DISTINCT collection FROM files "
                       "WHERE collection != ?", (DEFAULT_COLLECTION,))
        return
    db.commit()
    db.execute("PRAGMA foreign_keys = OFF")  # the chunks' references go to the new table once it is renamed
    db.executescript(_FILES.format(name="files_new") + """
        INSERT INTO files_new (id, root, source, path, sha256, size, n_chunks)
            SELECT id, root, source, path, sha256, size, n_chunks FROM files;
        DROP TABLE files;
        ALTER TABLE files_new RENAME TO files;
    """)
    db.execute("PRAGMA foreign_keys = ON")


def _refuse_dropping_others(directory: Path, collection: str) -> None:
    """A RagError when the live generation of ``directory`` holds files of
    collections other than ``collection`` (one that cannot be read holds
    nothing to keep)."""
    try:
        db = _connect(choose(directory).generation / "chunks.sqlite", readonly=True)
        try:
            column = _collection_column(db)
            named = {name for (name,) in db.execute(f"SELECT DISTINCT {column} FROM files")} | set(_created(db))
            others = sorted(named - {collection})
        finally:
            db.close()
    except (*_DAMAGE, IndexDamaged, IndexNotFound):
        return
    if others:
        raise RagError(f"rebuilding starts from an empty index and would drop the collections {', '.join(others)}; "
                       f"delete them first (rag collections delete NAME), or rebuild into a new --index")
