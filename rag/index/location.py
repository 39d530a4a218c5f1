"""Where an index lives: a folder (the embedded store: generations of FAISS,
SQLite and BM25 files) or a PostgreSQL database named by URL (``postgres``:
one index several front-ends share). Every caller that opens, writes or
asks about an index goes through these functions, so neither store is
special-cased elsewhere.

``index_location("~/idx")`` is a Path; ``index_location("postgresql://h/db")``
stays the URL, as written (a Path would fold its ``//``).

Does not: read or write an index itself (``store`` and ``postgres`` do).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Union

from ..errors import redacted
from ..paths import is_database_url
from .manifest import Manifest

IndexLocation = Union[Path, str]  # a folder, or a postgresql:// URL
is_index_url = is_database_url  # whether a location names a PostgreSQL database rather than a folder


def index_location(value: str | os.PathLike[str]) -> IndexLocation:
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


def index_exists(location: IndexLocation) -> bool:
    """Whether ``location`` holds a published index (intact or not)."""
    if is_index_url(location):
        from . import postgres

        return postgres.exists(str(location))
    from .generations import index_exists as folder_exists

    return folder_exists(Path(location))


def live_name(location: IndexLocation) -> str | None:
    """The name of the live generation (``CURRENT``, or the database's last
    commit): it changes at each publish, so a reader holding another name
    reopens. None when there is none."""
    if is_index_url(location):
        from . import postgres

        return postgres.live_name(str(location))
    from .generations import current_name

    return current_name(Path(location))


def live_manifest(location: IndexLocation) -> Manifest:
    """What the live index was built with (embedder, dim, chunker)."""
    if is_index_url(location):
        from . import postgres

        return postgres.live_manifest(str(location))
    from .store import live_manifest as folder_manifest

    return folder_manifest(Path(location))


def open_index(location: IndexLocation, *, embedder: str, dim: int):
    """The index at ``location`` opened for reading: a ``store.Index`` or a
    ``postgres.PostgresIndex``, which answer the same calls."""
    if is_index_url(location):
        from .postgres import PostgresIndex

        return PostgresIndex.open(str(location), embedder=embedder, dim=dim)
    from .store import Index

    return Index.open(Path(location), embedder=embedder, dim=dim)


@contextlib.contextmanager
def open_writer(location: IndexLocation, manifest: Manifest, *, fresh: bool = False) -> Iterator:
    """Changes to the index at ``location``, published only by ``commit()``
    (see ``store.open_writer`` and ``postgres.open_writer``)."""
    if is_index_url(location):
        from . import postgres

        with postgres.open_writer(str(location), manifest, fresh=fresh) as writer:
            yield writer
    else:
        from . import store

        with store.open_writer(Path(location), manifest, fresh=fresh) as writer:
            yield writer


def verify(location: IndexLocation) -> dict[str, object]:
    """``{"live": name, "generations": {name: "ok" or the problem}}``: every
    generation of a folder checked in full; a database has one, the live
    one, whose integrity is the server's."""
    if is_index_url(location):
        name = live_name(location)
        return {"live": name, "generations": {name: "ok (PostgreSQL)"} if name else {}}
    from .generations import verify as verify_folder

    return verify_folder(Path(location))
