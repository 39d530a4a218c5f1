"""``GET /v1/documents/{doc_id}/text`` and ``/file``: a document's content,
so a client can show where a source came from: its text as indexed (a
source's ``char_start``/``char_end`` are offsets into it) or its file (a PDF
for the browser's own viewer, ``#page=N``).

The document is found by its id among the index's own records; no path
ever comes from the client.

Does not: authenticate (the gate does) or change any document.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..errors import DocumentError, DocumentNotFound, IndexNotFound, RagError
from .errors import error, failure
from .keys import Caller
from ..index.collection_names import DEFAULT_COLLECTION
from .rights import CollectionQuery, refusal
from .state import ServiceState, caller, service

router = APIRouter()

DOC_ID = PathParam(..., max_length=64, description="A document id of GET /v1/documents")


def _refused(exc: RagError):
    if isinstance(exc, (DocumentNotFound, IndexNotFound)):
        return error(404, str(exc), "not_found")
    if isinstance(exc, DocumentError):
        return error(422, str(exc), "unreadable_document")
    return failure(exc)


@router.get("/v1/documents/{doc_id}/text")
async def document_text(doc_id: str = DOC_ID, collection: CollectionQuery = DEFAULT_COLLECTION,
                        state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """The document's text as the index holds it: ``text``, ``pages``
    (``[page, offset]`` pairs, empty without pages) and ``current`` (false
    when its file changed since it was indexed: spans may be off)."""
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    try:
        return await run_in_threadpool(state.pipeline.document_text, doc_id, collection)
    except RagError as exc:
        return _refused(exc)


FILE_RESPONSES = {200: {"description": "The file: a PDF as application/pdf, any other type as plain text",
                        "content": {"application/pdf": {}, "text/plain": {}}}}


@router.get("/v1/documents/{doc_id}/file", response_class=Response, responses=FILE_RESPONSES)
async def document_file(doc_id: str = DOC_ID, collection: CollectionQuery = DEFAULT_COLLECTION,
                        state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """The document's file as it lies now: PDFs as ``application/pdf``,
    every other type as plain text (an HTML page is shown, never run)."""
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    limit = state.pipeline.settings.max_file_bytes

    def read():
        found = state.pipeline.document(doc_id, collection)
        return found, found.read(limit)

    try:
        found, data = await run_in_threadpool(read)
    except RagError as exc:
        return _refused(exc)
    name = found.path.name
    headers = {"Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}", "X-Content-Type-Options": "nosniff"}
    if not found.is_pdf:
        headers["Content-Security-Policy"] = "sandbox"
    return Response(data, media_type=found.media_type, headers=headers)
