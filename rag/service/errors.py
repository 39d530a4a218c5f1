"""The service's errors on the wire: JSON ``{"error": {"message", "type"}}``,
and as a server-sent event in a stream that already started.

A message is written for whoever reads it over HTTP (a web page's user, an
API client), not for a shell: the library's errors tell a CLI user which
command to type (``rebuild it with `rag ingest --rebuild ...```); here those
clauses give way to what the reader can do (:func:`for_the_web`), and no
error leaves the service naming a command. The one exception is an app made
for the CLI's resident server (:data:`AUDIENCE` "shell", see
:class:`ShellWords`), whose client prints the message as ``rag`` itself would.

Does not: decide which status a failure gets beyond the common cases.
"""

from __future__ import annotations

import json
import math
import re
from contextvars import ContextVar

from fastapi.responses import JSONResponse

from ..errors import (CollectionNotFound, DocumentNotFound, EngineUnavailable, IndexBusy, IndexDamaged, IndexMismatch,
                      IndexNotFound, Overloaded, QuestionTooLong, RagError, SessionNotFound)
from ..retrieval import ScopeMatchesNothing
from .warmup import WarmUpFailed

# What a clause telling a shell user what to type looks like: a command in backticks, or pip.
_COMMAND = re.compile(r"`[^`]*`|\bpip install\b")
# Whom the messages of the request being answered are for: "web", or "shell" (see ShellWords).
AUDIENCE: ContextVar[str] = ContextVar("rag_service_audience", default="web")
NO_DOCUMENTS = "no documents are indexed yet: upload a document, then ask"
REBUILD = "the index has to be rebuilt on the server"
OPERATOR = "whoever runs this server can fix it"


def for_the_web(message: str, instead: str = OPERATOR) -> str:
    """``message`` without its clauses (``; ``-separated, or what follows a
    clause's last ``: `` before the command) that tell a shell user which
    command to type, ``instead`` said once in their place; as it was if it
    names no command.

    ``for_the_web("x: damaged; rebuild it with `rag ingest --rebuild`", REBUILD)``
    is ``"x: damaged; the index has to be rebuilt on the server"``.
    """
    if AUDIENCE.get() == "shell":
        return message
    kept: list[str] = []
    dropped = False
    for clause in message.split("; "):
        found = _COMMAND.search(clause)
        if found is None:
            kept.append(clause)
            continue
        dropped = True
        head = clause[:found.start()].rpartition(": ")[0]  # "psycopg is not installed: pip install ..."
        if head:
            kept.append(head)
    return "; ".join([*kept, instead]) if dropped else message


def web_message(exc: RagError) -> str:
    """What the service says of ``exc``: its message in the words of
    :func:`for_the_web` (no index at all: that no document is indexed yet)."""
    if AUDIENCE.get() == "shell":
        return str(exc)
    if isinstance(exc, IndexNotFound):
        return NO_DOCUMENTS
    return for_the_web(str(exc), REBUILD if isinstance(exc, (IndexDamaged, IndexMismatch)) else OPERATOR)


class ShellWords:
    """ASGI middleware of an app whose client is the CLI (the resident
    server): its errors keep the library's words, commands included."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        token = AUDIENCE.set("shell")
        try:
            await self.app(scope, receive, send)
        finally:
            AUDIENCE.reset(token)


def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    """A JSON error response (its message as :func:`for_the_web` words it)."""
    return JSONResponse({"error": {"message": for_the_web(message), "type": kind}}, status_code=status,
                        headers=headers)


def failure(exc: RagError) -> JSONResponse:
    """The response to a request that failed with ``exc``: 503 when the
    service could not warm up, 503 with Retry-After when the engine is unavailable, 409 with Retry-After when
    another process writes the index, 409 ``no_documents`` when there is no
    index yet (nothing uploaded), 503 when the index is damaged beyond
    falling back, 413 for a question too long, else 400 (the request can be
    fixed); each message in the words of :func:`web_message`."""
    message = web_message(exc)
    if isinstance(exc, Overloaded):
        return busy(exc.retry_after_s)
    if isinstance(exc, WarmUpFailed):
        return error(503, message, "warm_up_failed")
    if isinstance(exc, EngineUnavailable):
        return error(503, message, "engine_unavailable", {"Retry-After": "5"})
    if isinstance(exc, IndexBusy):
        return error(409, message, "index_busy", {"Retry-After": "5"})
    if isinstance(exc, IndexNotFound):
        return error(409, message, "no_documents")
    if isinstance(exc, IndexDamaged):
        return error(503, message, "index_damaged")
    if isinstance(exc, (CollectionNotFound, DocumentNotFound, SessionNotFound)):
        return error(404, message, "not_found")
    if isinstance(exc, ScopeMatchesNothing):
        return error(400, message, "scope_matches_nothing")
    return error(413 if isinstance(exc, QuestionTooLong) else 400, message, "invalid_request")


def outcome(exc: RagError) -> str:
    """The metrics label of a failed request."""
    if isinstance(exc, Overloaded):
        return "rejected"
    return "engine_error" if isinstance(exc, EngineUnavailable) else "bad_request"


def busy(retry_after_s: float) -> JSONResponse:
    """The 429 for a request whose expected wait exceeds its target."""
    seconds = max(1, math.ceil(retry_after_s))
    return error(429, f"the engine is busy: the expected wait exceeds the TTFT target; retry in {seconds} s",
                 "overloaded", {"Retry-After": str(seconds)})


def sse(obj: object) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def error_event(exc: BaseException) -> str:
    """The event that ends a stream which failed after it started: a
    RagError's own message, else only the kind of failure (never a trace)."""
    if isinstance(exc, RagError):
        kind = "engine_unavailable" if isinstance(exc, EngineUnavailable) else "invalid_request"
        return sse({"error": {"message": web_message(exc), "type": kind}})
    return sse({"error": {"message": f"internal error: {type(exc).__name__}", "type": "internal_error"}})
