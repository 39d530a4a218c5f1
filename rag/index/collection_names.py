"""Collections: the named sets of documents an index holds. Every file
belongs to one; a question retrieves from one; rights are given per
collection (``rag.service.keys``).

Does not: store anything (the index stores do, one column of their files).
"""

from __future__ import annotations

import re

from ..errors import RagError

DEFAULT_COLLECTION = "default"
EVERY_COLLECTION_NAME = "*"  # in a key file: every collection  # where documents go when none is named: one user's index as before
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def check_collection_name(name: str, where: str = "") -> str:
    """``name`` if it can name a collection (1-64 of a-z, 0-9, ``_`` and
    ``-``, starting with a letter or digit); else a RagError saying so."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RagError(f"{where + ': ' if where else ''}{name!r} cannot name a collection: use 1-64 lowercase letters, digits, "
                       "'_' or '-', starting with a letter or digit")
    return name


def missing_collection(name: str) -> str:
    """What a request for a collection that holds no documents is told, in
    the same words whether it holds none or the caller may not read it."""
    return f"the collection {name!r} holds no documents (rag ingest PATH --collection {name} adds some)"


def named(collection: str) -> str | None:
    """``collection`` as prompts name it: None for the default one, whose
    prompts name none (they stay as they were before collections)."""
    return None if collection == DEFAULT_COLLECTION else collection
