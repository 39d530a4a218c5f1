"""The gate in front of every route: without keys, the Host and Origin
(``origin``); with keys, the API key; and the caller's limits (``ratelimit``):
questions and uploads in flight, the bytes of those uploads, and a
generous rate against floods; all checked from the request's headers
alone, before any body is read, and a body (with a length or chunked) is
cut off at its limit. A refused request gets 429 with Retry-After and a
message naming the limit it met.

A caller is its API key, else its address: a team behind one address is
one caller, so the limits are on what a caller holds at once, not on how
many requests it makes a minute (issue 37). Over a Unix socket (the
resident server, one user's command line) there are no caller limits.

A raw ASGI middleware, because a FastAPI dependency runs only after the
body has been read: a caller without a key could otherwise make the server
hold a body of any size.

Does not: answer requests (the routes do).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Callable, Protocol

from . import origin
from .state import ServiceState

if TYPE_CHECKING:
    from .keys import KeyRing
    from .metrics import Metrics
    from .ratelimit import CallerLimits
    from .settings import ServiceSettings

QUESTIONS = frozenset({"/v1/ask", "/v1/chat/completions"})  # POSTed: the engine answers them
UPLOADS = "/v1/documents"  # POSTed: a document to ingest
RETRY_IN_FLIGHT_S = 1  # Retry-After of an upload refused for what its caller holds: one ends any moment
PUBLIC = frozenset({"/healthz", "/"})  # and the page's files, under /static/
STATIC_PREFIX = "/static/"
# Open without a key where keys are set and RAG_SERVE_PUBLIC_DOCS asks. Not /metrics: it counts every
# collection's questions and prompts, so it always takes a key that may read every collection (issue 55).
DOCS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def route_label(scope) -> str:
    """The metrics label of a request: its route's template
    (``/v1/documents/{doc_id}``), or ``other`` for a path no route serves,
    so that made-up paths cannot grow the metrics without bound (issue 27)."""
    from starlette.routing import Match

    app = scope.get("app")
    for route in getattr(app, "routes", ()):
        match, _ = route.matches(scope)
        if match != Match.NONE:
            return getattr(route, "path", "other") or "other"
    return "other"



def _over_unix_socket(scope) -> bool:
    """Whether the request came over a Unix socket (uvicorn names its path, with no port)."""
    server = scope.get("server")
    return isinstance(server, (tuple, list)) and len(server) == 2 and server[1] is None

class BodyTooLarge(Exception):
    """The request body went past its limit."""


def _response(status: int, message: str, kind: str, headers: dict[str, str] | None = None):
    body = json.dumps({"error": {"message": message, "type": kind}}).encode("utf-8")
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return ({"type": "http.response.start", "status": status, "headers": head},
            {"type": "http.response.body", "body": body})


def request_kind(scope) -> str:
    """Which of a caller's limits a request falls under: ``questions``
    (the engine answers it), ``uploads`` (a document to ingest) or ``other``."""
    if scope.get("method") != "POST":
        return "other"
    path = scope["path"]
    return "questions" if path in QUESTIONS else "uploads" if path == UPLOADS else "other"


def _too_many(limit: str, wait_s: float) -> tuple[int, str, str, dict[str, str]]:
    """The 429 of a request that met ``limit`` (named in words), to be retried after ``wait_s``."""
    seconds = max(1, math.ceil(wait_s))
    return 429, f"{limit}; retry in {seconds} s", "rate_limited", {"Retry-After": str(seconds)}


class GateState(Protocol):
    """What the gate reads of what it guards: the service's state, or MCP
    over HTTP's (``rag.mcp.server.OverHTTP``). ``answering`` (the queue's
    service time, for a question's Retry-After) is read only for the
    question routes, which only the service has."""

    settings: ServiceSettings
    keys: KeyRing
    limits: CallerLimits
    metrics: Metrics


class Gate:
    """ASGI middleware: authentication, limits per caller and body limits,
    in front of the service or of MCP over HTTP (see :class:`GateState`)."""

    def __init__(self, app, state: GateState | ServiceState) -> None:
        self.app, self.state = app, state

    def _caller(self, header: bytes):
        """The holder of the key an ``Authorization`` header carries, or None."""
        scheme, _, key = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        return self.state.keys.caller(key.strip().decode("latin-1"))

    def _refusal(self, scope) -> tuple[int, str, str, dict] | None:
        """Why the request may not go on (status, message, kind, headers), or None."""
        settings, path = self.state.settings, scope["path"]
        headers = dict(scope.get("headers") or ())
        # Keyless (so loopback): browsers' other sites are kept out. A Unix socket
        # (the resident server) is beyond any browser's reach; file modes guard it.
        if not settings.keyed and not _over_unix_socket(scope):
            why = origin.refusal(headers, settings.host)
            if why is not None:
                return 403, why, "forbidden", {}
        if path in PUBLIC or path.startswith(STATIC_PREFIX) or \
                (path in DOCS and (settings.public_docs or not settings.keyed)) or \
                (path == "/metrics" and not settings.keyed):
            return None
        address = f"addr:{scope['client'][0] if scope.get('client') else '?'}"
        caller = address
        if settings.keyed:
            holder = self._caller(headers.get(b"authorization", b""))
            if holder is None:
                wait = self.state.limits.auth_failures.take(address)
                if wait > 0:
                    return 429, f"too many wrong API keys from this address; retry in {math.ceil(wait)} s", \
                        "rate_limited", {"Retry-After": str(max(1, math.ceil(wait)))}
                return 401, "missing or wrong API key: send Authorization: Bearer KEY", "unauthorized", \
                    {"WWW-Authenticate": "Bearer"}
            caller = f"key:{holder.holder}"
            scope["rag.rights"] = holder  # what the routes let it read and write (``state.caller``)
        if _over_unix_socket(scope):
            return None  # one user's command line: no caller limits
        scope["rag.caller"] = caller  # whose in-flight requests ``_hold`` counts
        flood, kind = self.state.limits.flood, request_kind(scope)
        wait = flood.take(f"{caller}|{kind}")
        if wait > 0:
            self.state.metrics.requests.labels(route_label(scope), "rate_limited").inc()
            return _too_many(f"rate limit reached: more than {flood.burst:g} {kind} requests in a burst from this "
                             f"caller (at most {flood.per_minute} a minute)", wait)
        return None

    def _limit(self, scope) -> int:
        settings = self.state.settings
        return settings.max_upload_bytes + 65536 if scope["path"] == "/v1/documents" else settings.max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        limit, held = self._limit(scope), None
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if refusal is None and length is not None and (not length.isdigit() or int(length) > limit):
            refusal = 413, f"request body over {limit} bytes", "too_large", {}
        if refusal is None:
            held, refusal = self._hold(scope, limit)
        if refusal is not None:
            for message in _response(*refusal):
                await send(message)
            return
        try:
            await self._serve(scope, receive, send, limit)
        finally:
            if held is not None:
                held()  # the request has ended (answered, streamed to its end, or left)

    def _hold(self, scope, limit: int) -> tuple[Callable[[], None] | None, tuple | None]:
        """Take the request's place among what its caller holds in flight:
        (what gives it back when the request ends, None), or (None, the refusal)."""
        caller, kind = scope.get("rag.caller"), request_kind(scope)
        if caller is None or kind == "other":
            return None, None
        limits, settings = self.state.limits, self.state.settings
        length = dict(scope.get("headers") or ()).get(b"content-length")
        size = 0
        if kind == "uploads":  # the bytes it will hold; chunked: as many as it may send
            size = int(length) if length is not None and length.isdigit() else limit
        counter = limits.questions if kind == "questions" else limits.uploads
        over = counter.enter(caller, size)
        if over is None:
            return (lambda: counter.leave(caller, size)), None
        self.state.metrics.requests.labels(route_label(scope), "rate_limited").inc()
        if over == "bytes":
            return None, _too_many(f"the most a caller may have is {settings.upload_bytes_in_flight} bytes of uploads "
                                   "in flight (upload_bytes_in_flight)", RETRY_IN_FLIGHT_S)
        if kind == "questions":
            wait = max(RETRY_IN_FLIGHT_S, self.state.answering.service_s)
            return None, _too_many(f"this caller already has {counter.most} questions in flight, the most it may "
                                   "(questions_in_flight)", wait)
        return None, _too_many(f"this caller already has {counter.most} upload{'s' if counter.most != 1 else ''} "
                               "in flight, the most it may (uploads_in_flight)", RETRY_IN_FLIGHT_S)

    async def _serve(self, scope, receive, send, limit: int) -> None:
        """Run the app on the request, its body cut off past ``limit`` bytes (413)."""
        received = 0
        over = False
        started = False

        async def counted_receive():
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge()
            return message

        async def guarded_send(message):
            nonlocal started
            if over:
                return  # the app's answer to a cut body is replaced by the 413 below
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except BodyTooLarge:
            pass
        except Exception:
            if not over:
                raise
        if over and not started:
            for message in _response(413, f"request body over {limit} bytes", "too_large",
                                     {"Connection": "close"}):
                await send(message)
