"""The service's own routes: ``/v1/ask`` (the ``rag ask --json`` contract,
or server-sent events), ``/v1/search`` (the ``rag search --json`` contract),
``/v1/documents`` (upload, list, delete), ``/v1/profile`` (the prefill cost
model), ``/healthz`` and ``/metrics``.

Does not: authenticate (the app adds that to each route) or answer by itself.
"""

from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator

from fastapi import APIRouter, Depends, File, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from engine.backend import Replicated

from ..errors import CollectionNotFound, DocumentNotFound, IndexNotFound, RagError, engine_errors
from ..ingest.run import IngestCancelled
from ..index.collection_names import DEFAULT_COLLECTION, missing_collection
from ..qa.answer import Answer
from ..qa.stream import AnswerEvent, EvidenceFound
from ..qa.options import AskOptions, CollectionName
from .answering import ClientGone, ThreadedAnswer
from .errors import NO_DOCUMENTS, error, error_event, failure, for_the_web, outcome, sse
from .schemas import AskBody, CollectionBody, SearchBody
from .owners import SHELL_USER, as_seen_by, asking
from .rights import CollectionQuery, readable, refusal, service_wide_refusal
from .keys import Caller
from .state import ServiceState, caller, service
from .uploads import first_index

public = APIRouter()  # no key needed
router = APIRouter()  # behind the API keys


@public.get("/healthz")
async def healthz(state: ServiceState = Depends(service)) -> dict:
    """Liveness and readiness: "warming" (503) until the service has warmed
    up, "ok" once it answers, "error" (503, with why) if it could not warm
    up; with its queue depth, how many collections and documents the index
    holds (never their names), and, behind a router, the router's workers."""
    warmup = state.warmup
    found: dict[str, object] = {"status": warmup.status, "queue_depth": state.answering.depth}
    if warmup.error is not None:
        found["error"] = for_the_web(str(warmup.error))
    if warmup.seconds is not None:
        found["warm_up_s"] = round(warmup.seconds, 3)
    if warmup.status == "ok":
        # Counts only: /healthz needs no key, and a collection's name would tell that it exists.
        try:
            held = await run_in_threadpool(state.pipeline.collections)
            found["collections"], found["documents"] = len(held), sum(held.values())
        except RagError:
            pass  # the index is another check's (doctor); liveness does not depend on it
    backend = state.pipeline.components.loaded_backend
    router = backend.router_facts() if isinstance(backend, Replicated) else {}
    if router and warmup.status == "ok":
        found["engines"] = router
    return found if warmup.status == "ok" else JSONResponse(found, status_code=503)


@public.get("/metrics")
async def prometheus(state: ServiceState = Depends(service), who: Caller = Depends(caller)) -> Response:
    """Prometheus metrics; 403 for a key that may not read every collection
    (they count every collection's questions and prompts)."""
    refused = service_wide_refusal(who)
    if refused is not None:
        return refused
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/profile")
async def profile(state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """The prefill cost model budgets are planned with: the profile's key
    and fit, each measured point (calibration and recent answers) and the
    predicted prefill and TTFT of a prompt with nothing cached, by size;
    403 for a key that may not read every collection (the points are every
    collection's recent answers)."""
    refused = service_wide_refusal(who)
    if refused is not None:
        return refused

    def view() -> dict:
        with engine_errors():  # with no profile yet, the engine is measured now
            return state.pipeline.costs.view()

    try:
        return await run_in_threadpool(view)
    except RagError as exc:
        return failure(exc)


async def _ready_to_ask(body: AskBody, request: Request, state: ServiceState, who: Caller
                        ) -> tuple[str, Response | None]:
    """The collection a question's body names, and the response that ends
    the request first where there is one: 404 for a collection the key may
    not read (as one that holds no documents), or what waiting for a first
    index said (see ``uploads.first_index``)."""
    collection = body.collection or DEFAULT_COLLECTION
    refused = refusal(who, collection)
    if refused is not None:
        return collection, refused
    return collection, await first_index(state.pipeline, state.uploads, request.is_disconnected)


@router.post("/v1/retrieve")
async def retrieve(body: AskBody, request: Request, state: ServiceState = Depends(service),
                   who: Caller = Depends(caller)):
    """The chunks ``POST /v1/ask`` would put into the prompt for the same
    question and options, in prompt order, with the budget that chose them
    (``{"hits": [...], "budget": {...}}``); nothing is generated. What the
    LangChain retriever reads from a server (``Pipeline.budgeted``). A
    collection the key may not read is 404, as one that holds no documents."""
    collection, ended = await _ready_to_ask(body, request, state, who)
    if ended is not None:
        return ended
    try:
        _, caches = await run_in_threadpool(asking, state.pipeline.conversations, who, collection, None,
                                            body.cache_scope if who == SHELL_USER else None)
        options = AskOptions.of(**body.options() | {"session": None, "collection": collection, "cache_scope": caches})
        chosen = await run_in_threadpool(state.pipeline.budgeted, body.question, options)
    except RagError as exc:
        return failure(exc)
    return {"hits": [h.to_dict() for h in chosen.hits], "budget": chosen.budget.to_dict()}


@router.post("/v1/ask", response_model=Answer,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "The answer (``rag ask --json``), or with ``stream`` its events"}})
async def ask(body: AskBody, request: Request, state: ServiceState = Depends(service),
              who: Caller = Depends(caller)):
    """Answer a question from the index: the ``rag ask --json`` object,
    or with ``stream`` server-sent events: ``{"evidence": [...]}`` once the
    prompt is planned (before the first token), ``{"delta": text}``, then
    ``{"answer": {...}}`` (or ``{"error": {...}}`` if it fails midway).
    Errors before the prompt is planned are HTTP statuses. Asked while there
    is no index yet but a first upload is on its way, it waits for that
    upload's ingest (see ``uploads.first_index``). A collection the key may
    not read is 404, as one that holds no documents."""
    collection, ended = await _ready_to_ask(body, request, state, who)
    if ended is not None:
        return ended
    shown = {"session": body.session} if body.session is not None else {}  # the id the caller gave, not the stored one
    try:
        session, caches = await run_in_threadpool(  # a store read: off the loop
            asking, state.pipeline.conversations, who, collection, body.session,
            body.cache_scope if who == SHELL_USER else None)
        answer = state.answering.start("ask", body.question, body.options() | {
            "session": session, "collection": collection, "cache_scope": caches})
        if not body.stream:
            done = await answer.result_unless(request.is_disconnected)
            if done is None:
                return Response(status_code=499)
            # As is: a key's holder is told null for the figures of others' prompts, where the model says int.
            return JSONResponse(as_seen_by(who, done.to_dict() | shown))
        first = await answer.first_unless(request.is_disconnected)  # errors before it are still HTTP errors
    except StopAsyncIteration:
        first = None  # an empty answer: straight to the final event
    except ClientGone:
        return Response(status_code=499)
    except RagError as exc:
        state.metrics.requests.labels("ask", outcome(exc)).inc()
        return failure(exc)
    return StreamingResponse(_ask_events(answer, first, request.is_disconnected, shown, who),
                             media_type="text/event-stream")


async def _ask_events(answer: ThreadedAnswer, first: AnswerEvent | None, gone, shown: dict,
                      who: Caller) -> AsyncIterator[str]:
    try:
        if isinstance(first, EvidenceFound):  # the prompt is planned: the first token is still to come
            yield sse({"evidence": [e.to_dict() for e in first.evidence]})
        async for text in answer.texts(first, gone):
            yield sse({"delta": text})
        yield sse({"answer": as_seen_by(who, answer.answer.to_dict() | shown)})
    except ClientGone:
        return  # it left while its prompt was evaluated: the generation is stopped
    except Exception as exc:  # noqa: BLE001 - the stream has started: its end says what failed
        yield error_event(exc)
    finally:
        await answer.aclose()  # a client that left stops its generation


# OpenAPI links: what a client (or a stateful fuzzer) can do with an upload's answer.
UPLOAD_LINKS = {"responses": {"200": {"links": {
    "DeleteDocument": {"operationId": "delete_document_v1_documents__doc_id__delete",
                       "parameters": {"doc_id": "$response.body#/documents/0/id"}},
    "ListDocuments": {"operationId": "list_documents_v1_documents_get"},
    "Ask": {"operationId": "ask_v1_ask_post"},
    "DocumentText": {"operationId": "document_text_v1_documents__doc_id__text_get",
                     "parameters": {"doc_id": "$response.body#/documents/0/id"}},
}}}}


DISCONNECT_POLL_S = 0.25  # how often an upload's ingest asks whether its client is still there (chosen)


async def _ingest_while_connected(state: ServiceState, request: Request, name: str, data: bytes, collection: str):
    """``name`` uploaded and ingested on a worker thread; the ingest is
    cancelled (before its next batch embedded) when the client leaves or
    this coroutine is cancelled (a server shutting down), and waited for, so
    the next upload finds the folder and the index as they were."""
    cancel = threading.Event()
    work = asyncio.ensure_future(run_in_threadpool(state.pipeline.library.add, name, data, cancel=cancel,
                                                   collection=collection))
    try:
        while not work.done():
            if await request.is_disconnected():
                cancel.set()
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
    except asyncio.CancelledError:
        cancel.set()
        await asyncio.shield(work)  # the thread stops at its next batch; the lock is held until then
        raise
    return work.result()


@router.post("/v1/documents", openapi_extra=UPLOAD_LINKS)
async def upload(request: Request,
                 file: UploadFile = File(..., description="A document of a type rag-budget reads (.pdf, .docx, .md, ...)"),
                 collection: CollectionQuery = DEFAULT_COLLECTION,
                 state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """Upload a document into ``collection`` and ingest it (incremental and
    atomic: queries meanwhile run on the index as it was). A client that
    leaves before the answer stops its ingest: nothing of the file is kept.
    404 for a collection the key may not read, 403 for one it may only read."""
    refused = refusal(who, collection, write=True)
    if refused is not None:
        return refused
    limit = state.settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        return error(413, f"upload over {limit} bytes", "too_large")
    pipeline = state.pipeline
    async with state.ingesting:
        try:
            report = await _ingest_while_connected(state, request, file.filename or "", data, collection)
        except IngestCancelled:
            return Response(status_code=499)
        except RagError as exc:
            return failure(exc)
    if report.failed:
        return error(422, f"{report.failed[0][0]}: {report.failed[0][1]}", "unreadable_document")
    docs = await run_in_threadpool(pipeline.documents, collection)
    touched = set(report.added + report.updated + report.skipped)
    mine = [d for d in docs if pipeline.library.is_upload(d) and d["source"] in touched]
    return {"documents": mine, "report": report.counts()}


@router.get("/v1/documents")
async def list_documents(collection: CollectionQuery = DEFAULT_COLLECTION, state: ServiceState = Depends(service),
                         who: Caller = Depends(caller)):
    """Every document of ``collection``."""
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    try:
        return {"documents": await run_in_threadpool(state.pipeline.documents, collection)}
    except IndexNotFound:
        return error(404, NO_DOCUMENTS, "not_found")
    except RagError as exc:
        return failure(exc)


@router.delete("/v1/documents/{doc_id}")
async def delete_document(doc_id: str, collection: CollectionQuery = DEFAULT_COLLECTION,
                          state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """Remove a document of ``collection`` from the index (atomically) and,
    if uploaded, its file (404 where the key may not read the collection,
    403 where it may only read it)."""
    refused = refusal(who, collection, write=True)
    if refused is not None:
        return refused
    async with state.ingesting:
        try:
            return {"deleted": await run_in_threadpool(state.pipeline.remove_document, doc_id, collection)}
        except DocumentNotFound as exc:
            return error(404, str(exc), "not_found")
        except RagError as exc:
            return failure(exc)


@router.post("/v1/search")
async def search(body: SearchBody, request: Request, state: ServiceState = Depends(service),
                 who: Caller = Depends(caller)):
    """The chunks that best match ``query``, best first, without the model:
    the ``rag search --json`` object (waiting, as ``/v1/ask`` does, for a
    first upload still being indexed)."""
    refused = refusal(who, body.collection)
    if refused is not None:
        return refused
    waited = await first_index(state.pipeline, state.uploads, request.is_disconnected)
    if waited is not None:
        return waited
    try:
        hits = await run_in_threadpool(lambda: state.pipeline.search(body.query, body.k, mode=body.retrieval,
                                                                     scope=body.scope, collection=body.collection))
    except RagError as exc:
        return failure(exc)
    return {"results": [h.to_dict() for h in hits]}


@router.get("/v1/collections")
async def list_collections(state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """The collections this key may read, with the documents each holds."""
    try:
        found = await run_in_threadpool(state.pipeline.collections)
    except RagError as exc:
        return failure(exc)
    return {"collections": [{"name": name, "documents": found[name]} for name in readable(who, sorted(found))]}


@router.post("/v1/collections")
async def create_collection(body: CollectionBody, state: ServiceState = Depends(service),
                            who: Caller = Depends(caller)):
    """Make the collection ``name``, holding no documents yet: 201 with
    ``created`` true, or 200 with false when it exists already (404 where
    the key may not read it, 403 where it may only read it)."""
    refused = refusal(who, body.name, write=True)
    if refused is not None:
        return refused
    async with state.ingesting:
        try:
            new = await run_in_threadpool(state.pipeline.create_collection, body.name)
        except RagError as exc:
            return failure(exc)
    return JSONResponse({"collection": body.name, "created": new}, status_code=201 if new else 200)


@router.delete("/v1/collections/{name}")
async def delete_collection(name: CollectionName, state: ServiceState = Depends(service),
                            who: Caller = Depends(caller)):
    """Delete the collection ``name`` with every document in it (404 where
    the key may not read it, 403 where it may only read it)."""
    refused = refusal(who, name, write=True)
    if refused is not None:
        return refused
    async with state.ingesting:
        try:
            return {"deleted": {"collection": name,
                                "documents": await run_in_threadpool(state.pipeline.remove_collection, name)}}
        except DocumentNotFound:
            return failure(CollectionNotFound(missing_collection(name)))
        except RagError as exc:
            return failure(exc)
