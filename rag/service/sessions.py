"""``/v1/sessions``: the stored conversations, one conversation's turns,
and forgetting one (its turns, summary and KV snapshot).

Does not: answer questions (``/v1/ask`` with a ``session`` continues one).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool

from ..errors import RagError, SessionNotFound
from .errors import error, failure
from .keys import Caller
from .owners import own_sessions, stored_session
from ..index.collection_names import DEFAULT_COLLECTION
from .rights import CollectionQuery, refusal
from .state import ServiceState, caller, service

router = APIRouter()

SESSION = PathParam(..., max_length=128, description="A session id, as given to /v1/ask")


@router.get("/v1/sessions")
async def list_sessions(collection: CollectionQuery = DEFAULT_COLLECTION, state: ServiceState = Depends(service),
                        who: Caller = Depends(caller)):
    """The stored conversations of the index this service answers from
    (a conversation store may be shared by services over other indexes):
    ``session``, ``turns`` and ``updated`` (seconds since the epoch), newest
    first. One stored before sessions recorded their index is listed once
    a question continues it here. Only the key's own, of ``collection``."""
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    try:
        pipeline = state.pipeline
        listed = await run_in_threadpool(
            lambda: own_sessions(pipeline.conversations, who, collection, pipeline.memory.sessions()))
        return {"sessions": listed}
    except RagError as exc:
        return failure(exc)


@router.get("/v1/sessions/{session}")
async def show_session(session: str = SESSION, collection: CollectionQuery = DEFAULT_COLLECTION,
                       state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """One conversation: its ``summary`` of older turns, how many turns
    were ``folded`` into it, and the recent ``turns`` (number, question,
    answer, sources), oldest first; 404 if it has none (or it is another key's)."""
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    try:
        conversation = await run_in_threadpool(lambda: state.pipeline.conversation(
            stored_session(state.pipeline.conversations, who, collection, session)))
    except SessionNotFound:
        return error(404, f"no conversation {session}; GET /v1/sessions lists them", "not_found")
    except RagError as exc:
        return failure(exc)
    if not conversation.turns and not conversation.folded:
        return error(404, f"no conversation {session}; GET /v1/sessions lists them", "not_found")
    return {
        "session": session, "summary": conversation.summary, "folded": conversation.folded,
        "turns": [{"number": t.number, "question": t.question, "answer": t.answer, "sources": list(t.sources)}
                  for t in conversation.turns],
    }


@router.delete("/v1/sessions/{session}")
async def reset_session(session: str = SESSION, collection: CollectionQuery = DEFAULT_COLLECTION,
                        state: ServiceState = Depends(service), who: Caller = Depends(caller)):
    """Forget a conversation: its turns, summary and KV snapshot; 404 if it
    has none (or it is another key's)."""
    pipeline = state.pipeline
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    shown = session

    def reset() -> bool:
        # Found as show_session finds it (turns or a summary under the caller's own stored id), so
        # deleting what the caller may not read answers as reading it does.
        stored = stored_session(pipeline.conversations, who, collection, shown)
        found = pipeline.conversation(stored)
        if not found.turns and not found.folded:
            return False
        pipeline.reset(stored)
        return True

    try:
        if not await run_in_threadpool(reset):
            return error(404, f"no conversation {shown}; GET /v1/sessions lists them", "not_found")
    except SessionNotFound:
        return error(404, f"no conversation {shown}; GET /v1/sessions lists them", "not_found")
    except RagError as exc:
        return failure(exc)
    return {"reset": shown}
