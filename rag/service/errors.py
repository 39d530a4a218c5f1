"""The service's errors on the wire: JSON ``{"error": {"message", "type"}}``,
and as a server-sent event in a stream that already started.

Does not: decide which status a failure gets beyond the common cases.
"""

from __future__ import annotations

import json
import math

from fastapi.responses import JSONResponse

from ..errors import EngineUnavailable, IndexBusy, IndexDamaged, Overloaded, QuestionTooLong, RagError
from ..retrieval import ScopeMatchesNothing
from .warmup import WarmUpFailed


def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)


def failure(exc: RagError) -> JSONResponse:
    """The response to a request that failed with ``exc``: 503 when the
    service could not warm up, 503 with Retry-After when the engine is unavailable, 409 with Retry-After when
    another process writes the index, 503 when the index is damaged beyond
    falling back, 413 for a question too long, else 400 (the request can be
    fixed)."""
    if isinstance(exc, Overloaded):
        return busy(exc.retry_after_s)
    if isinstance(exc, WarmUpFailed):
        return error(503, str(exc), "warm_up_failed")
    if isinstance(exc, EngineUnavailable):
        return error(503, str(exc), "engine_unavailable", {"Retry-After": "5"})
    if isinstance(exc, IndexBusy):
        return error(409, str(exc), "index_busy", {"Retry-After": "5"})
    if isinstance(exc, IndexDamaged):
        return error(503, str(exc), "index_damaged")
    if isinstance(exc, ScopeMatchesNothing):
        return error(400, str(exc), "scope_matches_nothing")
    return error(413 if isinstance(exc, QuestionTooLong) else 400, str(exc), "invalid_request")


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
        return sse({"error": {"message": str(exc), "type": kind}})
    return sse({"error": {"message": f"internal error: {type(exc).__name__}", "type": "internal_error"}})
