"""The service's application: wiring, the gate (keys, rate and body
limits) and error handlers around the routes (``routes``, ``openai``).

Does not: answer questions itself or read anything back with pickle.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import RagError
from ..qa.pipeline import Pipeline
from . import content, openai, routes, sessions
from .errors import REBUILD, ShellWords, error, failure, for_the_web
from .gate import Gate
from .keys import LOCAL_USER
from .owners import SHELL_USER
from .settings import ServiceSettings
from .state import ServiceState, warmed
from .uploads import TrackUploads
from .watching import FolderWatcher
from .web import add_page

ERROR_TYPES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 429: "rate_limited"}


def create_app(pipeline: Pipeline, settings: ServiceSettings | None = None, *,
               audience: Literal["web", "shell"] = "web") -> FastAPI:
    """The FastAPI application serving ``pipeline``; its error messages are
    worded for the ``audience``: "web" (a page, an API client: no command
    to type) or "shell" (the CLI's resident server: the CLI's own words)."""
    settings = settings or ServiceSettings()
    state = ServiceState.create(pipeline, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.warmup.start()  # the server listens meanwhile: /healthz says "warming"
        # Watched folders are kept indexed while the service runs.
        watcher = FolderWatcher(pipeline, settings.watch) if settings.watch else None
        app.state.watcher = watcher
        if watcher is not None:
            watcher.start()
        try:
            yield
        finally:
            state.warmup.stop()  # a warm-up still being tried in the background tries no more
            if watcher is not None:
                watcher.stop()

    app = FastAPI(title="rag-budget", version="1", description="Local document QA that treats the prompt as a cost.",
                  lifespan=lifespan)
    app.state.service = state
    # Who a request without a key is: the local user, or through the resident server's socket its shell,
    # whose session ids are stored as given (rag.service.owners).
    app.state.keyless_caller = SHELL_USER if audience == "shell" else LOCAL_USER
    # Kept for tests and the bench: the parts they look at.
    app.state.pipeline, app.state.settings, app.state.metrics = pipeline, settings, state.metrics
    _add_error_handlers(app)
    app.add_middleware(TrackUploads, uploads=state.uploads)  # inside the gate: only uploads it let through
    app.add_middleware(Gate, state=state)  # keys, rate and body limits, before any body is read
    if audience == "shell":
        app.add_middleware(ShellWords)  # around the gate: its refusals too
    app.include_router(routes.public)
    ready = [Depends(warmed)]  # nothing is answered (or timed) before the warm-up ends
    app.include_router(routes.router, dependencies=ready)
    app.include_router(openai.router, dependencies=ready)
    app.include_router(content.router, dependencies=ready)
    app.include_router(sessions.router, dependencies=ready)
    add_page(app)  # "/" and /static/: the page, which needs no key (its API calls do)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # A union's branches each fail: the deepest error is about what was sent.
        first = max(errors, key=lambda e: len(e.get("loc", ()))) if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return error(422, f"invalid request body: {where or 'body'}: {message}", "invalid_request")

    @app.exception_handler(StarletteHTTPException)  # FastAPI's and the router's (404, 405) alike
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = ERROR_TYPES.get(exc.status_code, "http_error")
        return error(exc.status_code, str(exc.detail), kind, getattr(exc, "headers", None))

    @app.exception_handler(RagError)
    async def _rag(request: Request, exc: RagError):
        return failure(exc)

    @app.exception_handler(sqlite3.DatabaseError)
    async def _damaged(request: Request, exc: sqlite3.DatabaseError):
        # The index's chunk database went bad under the running server (truncated, overwritten):
        # the client's request is fine, the service is not, until the index is rebuilt (issue 27).
        message = " ".join(str(exc).split())[:200]
        return error(503, for_the_web(f"the index cannot be read ({message}); rebuild it with `rag ingest --rebuild`",
                                      REBUILD), "index_damaged")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # never a stack trace to the client
        return error(500, f"internal error: {type(exc).__name__}", "internal_error")


def serve(pipeline: Pipeline, settings: ServiceSettings) -> None:
    """Run the service until interrupted; everything is loaded before the
    first request is answered (not during it)."""
    import uvicorn

    from .watching import stop_ingests_on_exit

    settings.check()
    # The app warms up once it listens (see ``warmup``): /healthz says "warming" until then.
    server = uvicorn.Server(uvicorn.Config(create_app(pipeline, settings), host=settings.host, port=settings.port,
                                           log_level="info"))
    stop_ingests_on_exit(server, pipeline.library)  # SIGTERM does not wait for an upload's ingest to end
    server.run()
