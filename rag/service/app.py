"""The service's application: wiring, authentication, limits and error
handlers around the routes (``routes``, ``openai``).

Does not: answer questions itself or read anything back with pickle.
"""

from __future__ import annotations

import hmac
import math

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..qa.pipeline import Pipeline
from . import openai, routes
from .errors import error
from .settings import ServiceSettings
from .state import ServiceState, service

ERROR_TYPES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 429: "rate_limited"}


def create_app(pipeline: Pipeline, settings: ServiceSettings | None = None) -> FastAPI:
    """The FastAPI application serving ``pipeline``."""
    settings = settings or ServiceSettings()
    state = ServiceState.create(pipeline, settings)
    app = FastAPI(title="rag-budget", version="1", description="Local document QA that treats the prompt as a cost.")
    app.state.service = state
    # Kept for tests and the bench: the parts they look at.
    app.state.pipeline, app.state.settings, app.state.metrics = pipeline, settings, state.metrics
    app.state.queue = state.answering.queue
    _add_error_handlers(app)
    _add_body_limit(app, settings)
    app.include_router(routes.public)
    app.include_router(routes.router, dependencies=[Depends(authorised)])
    app.include_router(openai.router, dependencies=[Depends(authorised)])
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(422, f"invalid request body: {where or 'body'}: {first.get('msg', 'invalid')}", "invalid_request")

    @app.exception_handler(StarletteHTTPException)  # FastAPI's and the router's (404, 405) alike
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = ERROR_TYPES.get(exc.status_code, "http_error")
        return error(exc.status_code, str(exc.detail), kind, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # never a stack trace to the client
        return error(500, f"internal error: {type(exc).__name__}", "internal_error")


def _add_body_limit(app: FastAPI, settings: ServiceSettings) -> None:
    @app.middleware("http")
    async def _limit_body(request: Request, call_next):
        limit = settings.max_upload_bytes + 65536 if request.url.path == "/v1/documents" else settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return error(413, f"request body over {limit} bytes", "too_large")
        return await call_next(request)


def authorised(request: Request, state: ServiceState = Depends(service)) -> None:
    """Let the request through if it carries a valid API key (when keys are
    set) and its caller is within the rate limit; else 401 or 429."""
    settings = state.settings
    caller = f"addr:{request.client.host if request.client else '?'}"
    if settings.api_keys:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(key.strip(), k) for k in settings.api_keys):
            raise HTTPException(401, "missing or wrong API key: send Authorization: Bearer KEY",
                                headers={"WWW-Authenticate": "Bearer"})
        caller = f"key:{key.strip()}"
    wait = state.limiter.take(caller)
    if wait > 0:
        state.metrics.requests.labels(request.url.path, "rate_limited").inc()
        raise HTTPException(429, f"rate limit of {settings.rate_limit_per_minute} requests a minute reached; "
                            f"retry in {math.ceil(wait)} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})


def serve(pipeline: Pipeline, settings: ServiceSettings) -> None:
    """Run the service until interrupted, with everything loaded before the
    first request (not during it)."""
    import uvicorn

    settings.check()
    pipeline.prepare()
    uvicorn.run(create_app(pipeline, settings), host=settings.host, port=settings.port, log_level="info")
