"""What a caller may do with a collection, as the routes answer it: a
collection the caller may not read is 404 in the very words of one that
holds no documents (a 403 would say that it exists); one it may read but
not change is 403 on uploads and deletes.

Does not: find the caller (``gate`` does, from its key) or keep the rights
(``keys`` does).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from fastapi.responses import JSONResponse

from ..errors import CollectionNotFound
from ..index.collection_names import DEFAULT_COLLECTION, missing_collection
from ..qa.options import AskOptions, CollectionName
from .errors import error, failure
from .keys import EVERY_COLLECTION, Caller


# ``?collection=NAME`` on the document routes (uploads, lists, deletes, reads).
# A collection named in the query, checked as a body's is: FastAPI applies the name's validator only
# where Query() sits inside the annotation (a Query() default let "/" through to the uploads folder, a 500).
CollectionQuery = Annotated[CollectionName, Query(description=AskOptions.describe("collection"))]


def refusal(caller: Caller, collection: str, *, write: bool = False) -> JSONResponse | None:
    """The response refusing ``caller`` this use of ``collection`` (reading,
    or with ``write`` changing it), or None when it may."""
    if not caller.may_read(collection):
        return failure(CollectionNotFound(missing_collection(collection)))
    if write and not caller.may_write(collection):
        return error(403, f"{caller.holder} may search and ask in the collection {collection!r}, not change it",
                     "forbidden")
    return None


def readable(caller: Caller, names) -> list[str]:
    """Those of ``names`` that ``caller`` may read, in their order."""
    return [name for name in names if caller.may_read(name)]


def service_wide_refusal(caller: Caller) -> JSONResponse | None:
    """The response refusing ``caller`` the service's own figures
    (``/metrics``, ``/v1/profile``: prompt sizes, answers and waits of every
    collection's callers), or None when it may read every collection."""
    if caller.may_read(EVERY_COLLECTION):
        return None
    return error(403, "the service's figures cover every collection: they need a key that may read every "
                      "collection (\"*\" in the key file) or a plain API key", "forbidden")
