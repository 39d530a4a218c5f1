"""Where an index lives: a folder (the embedded store: generations of FAISS,
SQLite and BM25 files) or a PostgreSQL database named by URL (``postgres``:
one index several front-ends share). Every caller that opens, writes or
asks about an index goes through these functions, and :func:`store_for`
picks the store (an ``interface.IndexStore``) once, so neither store is
special-cased elsewhere.

``as_index_location("~/idx")`` is a Path; ``as_index_location("postgresql://h/db")``
stays the URL, as written (a Path would fold its ``//``).

Does not: read or write an index itself (``store`` and ``postgres`` do).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Union

from ..errors import redacted
from ..paths import is_database_url
from .collection_names import DEFAULT_COLLECTION
from .manifest import Manifest

if TYPE_CHECKING:  # the client path reads settings, and must not import NumPy
    from .interface import IndexReader, IndexStore, IndexWriter

IndexLocation = Union[Path, str]  # a folder, or a postgresql:// URL
is_index_url = is_database_url  # whether a location names a PostgreSQL database rather than a folder


def as_index_location(value: str | os.PathLike[str]) -> IndexLocation:
    """``value`` as an index location: a URL as it is, anything else a Path (``~`` expanded)."""
    return value if is_index_url(value) else Path(value).expanduser()


def folder_of(location: IndexLocation) -> Path | None:
    """The folder of a folder index (None for a database)."""
    return None if is_index_url(location) else Path(location)


def shown(location: IndexLocation) -> str:
    """``location`` as messages and reports show it: a URL without its password."""
    if is_index_url(location):
        return redacted(str(location))
    return str(location)


class _FolderStore:
    """Indexes in folders: ``store`` over ``generations``."""

    def exists(self, location) -> bool:
        from .generations import index_exists

        return index_exists(Path(location))

    def live_name(self, location) -> str | None:
        from .generations import current_name

        return current_name(Path(location))

    def live_manifest(self, location) -> Manifest:
        from .store import live_manifest

        return live_manifest(Path(location))

    def open_index(self, location, *, embedder: str, dim: int) -> IndexReader:
        from .store import FolderIndex

        return FolderIndex.open(Path(location), embedder=embedder, dim=dim)

    def open_writer(self, location, manifest: Manifest, *, fresh: bool = False, collection: str = DEFAULT_COLLECTION):
        from .store import open_writer

        return open_writer(Path(location), manifest, fresh=fresh, collection=collection)

    def verify(self, location) -> dict[str, object]:
        from .generations import verify

        return verify(Path(location))


class _PostgresStore:
    """Indexes in PostgreSQL databases: ``postgres``."""

    def exists(self, location) -> bool:
        from . import postgres

        return postgres.exists(str(location))

    def live_name(self, location) -> str | None:
        from . import postgres

        return postgres.live_name(str(location))

    def live_manifest(self, location) -> Manifest:
        from . import postgres

        return postgres.live_manifest(str(location))

    def open_index(self, location, *, embedder: str, dim: int) -> IndexReader:
        from .postgres import PostgresIndex

        return PostgresIndex.open(str(location), embedder=embedder, dim=dim)

    def open_writer(self, location, manifest: Manifest, *, fresh: bool = False, collection: str = DEFAULT_COLLECTION):
        from . import postgres

        return postgres.open_writer(str(location), manifest, fresh=fresh, collection=collection)

    def verify(self, location) -> dict[str, object]:
        # A database holds one generation, the live one, whose integrity is the server's.
        name = self.live_name(location)
        return {"live": name, "generations": {name: "ok (PostgreSQL)"} if name else {}}


_FOLDERS, _DATABASES = _FolderStore(), _PostgresStore()


def store_for(location: IndexLocation) -> IndexStore:
    """The store that holds indexes like ``location``: the one place a
    location's kind is looked at (a new store is a branch here)."""
    return _DATABASES if is_index_url(location) else _FOLDERS


def index_exists(location: IndexLocation) -> bool:
    """Whether ``location`` holds a published index (intact or not)."""
    return store_for(location).exists(location)


def live_name(location: IndexLocation) -> str | None:
    """The name of the live generation (``CURRENT``, or the database's last
    commit): it changes at each publish, so a reader holding another name
    reopens. None when there is none."""
    return store_for(location).live_name(location)


def live_manifest(location: IndexLocation) -> Manifest:
    """What the live index was built with (embedder, dim, chunker)."""
    return store_for(location).live_manifest(location)


def open_index(location: IndexLocation, *, embedder: str, dim: int) -> IndexReader:
    """The index at ``location`` opened for reading (an :class:`IndexReader`)."""
    return store_for(location).open_index(location, embedder=embedder, dim=dim)


@contextlib.contextmanager
def open_writer(location: IndexLocation, manifest: Manifest, *, fresh: bool = False,
                collection: str = DEFAULT_COLLECTION) -> Iterator[IndexWriter]:
    """Changes to the index at ``location``, published only by ``commit()``
    (an :class:`IndexWriter`; see ``store.open_writer`` and ``postgres.open_writer``)."""
    with store_for(location).open_writer(location, manifest, fresh=fresh, collection=collection) as writer:
        yield writer


def verify(location: IndexLocation) -> dict[str, object]:
    """``{"live": name, "generations": {name: "ok" or the problem}}``: every
    generation of a folder checked in full; a database has one, the live
    one, whose integrity is the server's."""
    return store_for(location).verify(location)
