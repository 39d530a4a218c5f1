"""What an index store is: the calls the rest of the project makes of the
index, whatever holds it. The folder store (``store``: FAISS, BM25 arrays
and SQLite in generation folders) and the PostgreSQL store (``postgres``:
pgvector and SQL) implement them; ``location`` picks one by the index's
location, once. A new store is a new module implementing these three and a
line in ``location``, and passes ``tests/test_index_contract.py``.

Does not: hold anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterable, Protocol, Sequence, runtime_checkable

from .collection_names import DEFAULT_COLLECTION
from .manifest import Manifest
from .records import FileRecord, Hit, stored_location, stored_units

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class IndexReader(Protocol):
    """A read-only view of one published state of an index."""

    directory: object  # what messages name it by: the folder, or the redacted URL
    manifest: Manifest
    notes: list[str]  # what was wrong with it, for the user
    on_note: Callable[[str], None]

    def close(self) -> None: ...
    def __len__(self) -> int: ...
    # Each search keeps to the chunks of ``collection`` (None: of any) among the chunk ids ``allowed`` (None: all
    # of them), the collection's filter applied by the store itself (a folder generation holding that collection
    # alone needs none; PostgreSQL's live rows always do); BM25 ranks by that collection's statistics only, so
    # a ranking in one collection is the same, scores included, whatever another holds.
    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
               collection: str | None = None) -> list[Hit]: ...
    def search_ids(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
                   collection: str | None = None) -> list[tuple[int, float]]: ...
    def lexical_search(self, query: str, k: int, allowed: np.ndarray | None = None, *,
                       collection: str | None = None) -> list[tuple[int, float]]: ...
    def lexical(self) -> object: ...
    # Those of ``words`` that no chunk of ``collection`` (None: of any) holds, read in its languages.
    def unheard(self, words: Sequence[str], *, collection: str | None = None) -> list[str]: ...
    def chunk_ids_of(self, sources: Callable[[str], bool], key: object, collection: str | None = None
                     ) -> np.ndarray: ...
    def collections(self) -> dict[str, int]: ...
    def hits(self, ids: Sequence[int], query: np.ndarray, known: dict[int, float] | None = None) -> list[Hit]: ...
    def files(self, root: str | None = None, collection: str = DEFAULT_COLLECTION
              ) -> dict[tuple[str, str], FileRecord]: ...
    def passages(self) -> list[tuple[str, str, int | None, str]]: ...
    def chunks(self) -> list[tuple[int, str, str, np.ndarray, str]]: ...
    def stats(self) -> dict[str, object]: ...


@runtime_checkable
class IndexWriter(Protocol):
    """Changes to one collection of an index, published together by
    :meth:`commit` (or not at all): it sees and changes that collection's
    files only."""

    manifest: Manifest
    notes: list[str]
    collection: str

    def files(self, root: str | None = None) -> dict[tuple[str, str], FileRecord]: ...
    def remove_file(self, file_id: int) -> None: ...
    def exists(self) -> bool: ...
    def record(self, kept: bool) -> None: ...
    def create_collection(self) -> bool: ...
    def remove_collection(self) -> int | None: ...
    def vectors_by_text(self, file_id: int) -> dict[str, np.ndarray]: ...
    def add_file(self, *, root: str, source: str, path: str, sha256: str, size: int, mtime: float,
                 chunks: Iterable, vectors: np.ndarray) -> object: ...
    def commit(self) -> None: ...


class IndexStore(Protocol):
    """Where indexes of one kind live: how to find, open and change one."""

    def exists(self, location: str | Path) -> bool: ...
    def live_name(self, location: str | Path) -> str | None: ...
    def live_manifest(self, location: str | Path) -> Manifest: ...
    def open_index(self, location: str | Path, *, embedder: str, dim: int) -> IndexReader: ...
    def open_writer(self, location: str | Path, manifest: Manifest, *, fresh: bool = False,
                    collection: str = DEFAULT_COLLECTION) -> ContextManager[IndexWriter]: ...
    def verify(self, location: str | Path) -> dict[str, object]: ...


# The chunk's columns a Hit is made of, in the order :func:`hit_of` reads them (chunks c JOIN files f).
HIT_COLUMNS = ("c.chunk_id, c.source, c.text, c.page, c.char_start, c.char_end, c.position, c.location, "
               "c.context, f.root, c.lang, c.units")


def hit_of(row: Sequence, score: float) -> Hit:
    """The Hit of a row of :data:`HIT_COLUMNS` (its location as stored: JSON text, or already a dict)."""
    return Hit(chunk_id=row[0], source=row[1], score=score, text=row[2], page=row[3], char_start=row[4],
               char_end=row[5], position=row[6], location=stored_location(row[7]), context=row[8], root=row[9],
               lang=row[10], units=stored_units(row[11]))


# The collections an index holds, each recorded from its creation (or first file) to its deletion,
# so one emptied or created empty is still listed; the files table names each file's collection.
COLLECTIONS_TABLE = "CREATE TABLE IF NOT EXISTS {name} (name TEXT PRIMARY KEY)"


def remove_every_file(writer: IndexWriter) -> int:
    """Remove every file ``writer`` sees (those of its collection) with their chunks; how many."""
    records = list(writer.files().values())
    for record in records:
        writer.remove_file(record.id)
    return len(records)


def create_collection(writer: IndexWriter) -> bool:
    """Record ``writer``'s collection, empty if it holds nothing yet; whether it is new."""
    new = not writer.exists()
    writer.record(True)
    return new


def keep_listed(writer: IndexWriter) -> None:
    """What adding a file does to ``writer``'s collection's record: a named
    collection is recorded, so it is still listed once emptied; the default
    one is listed while it holds files (unless made on purpose)."""
    if writer.collection != DEFAULT_COLLECTION:
        writer.record(True)


def remove_collection(writer: IndexWriter) -> int | None:
    """Remove ``writer``'s collection: every file, with their chunks, and
    its record; how many files (None: there was no such collection)."""
    if not writer.exists():
        return None
    removed = remove_every_file(writer)
    writer.record(False)
    return removed


def stats_of(index: IndexReader, *, files: int, chunks: int, tokens: int, vectors: int, vector_search: str,
             lexical: bool, size: int, languages: dict[str, int], **more: object) -> dict[str, object]:
    """The ``rag doctor`` figures of ``index``, the same keys for every store (``more``: a store's own)."""
    m = index.manifest
    return {"path": str(index.directory), **more, "files": files, "chunks": chunks, "tokens": int(tokens),
            "vectors": vectors, "vector_search": vector_search, "lexical": lexical, "bytes": int(size),
            "embedder": m.embedder, "dim": m.dim, "chunker": m.chunker, "format_version": m.format_version,
            "languages": languages}


