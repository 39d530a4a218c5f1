"""The document-QA HTTP service: a thin FastAPI layer over :class:`Pipeline`.

Endpoints: ``POST /v1/ask`` (the ``rag ask --json`` contract; server-sent
events with ``stream``), ``POST /v1/chat/completions`` (OpenAI-compatible,
with the sources in an extra ``sources`` field), ``GET /healthz``,
``GET /metrics`` (Prometheus) and the OpenAPI docs at ``/docs``.

One model serves every request: the engine runs one generation at a time
and requests queue for it. The queue is visible to the budgeter: each
request is planned with the wait expected ahead of it, so under load it
takes fewer chunks instead of missing its target, and one whose wait alone
would exceed its target is answered 429 with ``Retry-After``.

Does not: retrieve, budget or generate by itself (the pipeline does), or
read anything back with pickle.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import threading
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Iterator, Literal

from fastapi import Depends, FastAPI, File, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .answer import Answer
from .errors import DocumentNotFound, QuestionTooLong, RagError
from .pipeline import DEFAULT_MAX_TOKENS, Pipeline, default_target_ttft


class ServiceSettings(BaseSettings):
    """Settings of ``rag serve``, from arguments or ``RAG_SERVE_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="RAG_SERVE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys; required off loopback")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body")
    max_tokens_limit: int = Field(1024, ge=1, description="Most answer tokens a request may ask for")
    max_upload_bytes: int = Field(20 << 20, ge=1024, description="Largest document upload")
    rate_limit_per_minute: int = Field(120, ge=0, description="Requests per minute per API key (or client address); 0: none")
    reject_over_target: bool = Field(True, description="429 when the queue alone exceeds the target; else minimum context")
    load_aware: bool = Field(True, description="Plan each request's budget with the queue wait expected ahead of it")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value):
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    def check(self) -> None:
        """Refuse settings that would expose the service: a non-loopback
        address without API keys."""
        if not _is_loopback(self.host) and not self.api_keys:
            raise RagError(
                f"binding {self.host} exposes the service beyond this machine: set API keys "
                "(RAG_SERVE_API_KEYS=key1,key2) or bind 127.0.0.1"
            )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- request bodies ----------------------------------------------------------


class AskBody(BaseModel):
    """``POST /v1/ask``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., min_length=1, max_length=20_000)
    target_ttft_s: float | None = Field(None, gt=0, le=600)
    session: str | None = Field(None, max_length=128)
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    stream: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list | None = None


class ChatBody(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI fields this service uses;
    others are accepted and ignored. ``session`` (an extra field, or
    ``user``) continues a stored conversation; without one, the last user
    message is answered on its own."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=128)
    session: str | None = Field(None, max_length=128)
    target_ttft_s: float | None = Field(None, gt=0, le=600)


def _text(content: str | list | None) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


# -- the engine queue ----------------------------------------------------------


class EngineQueue:
    """How many requests are waiting for or using the engine, and how long
    one takes there, to predict a newcomer's wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.depth = 0
        self._service_s = 1.0  # a moving average of time on the engine per request

    def expected_wait(self) -> float:
        """Seconds a request arriving now is expected to wait for the engine."""
        with self._lock:
            return self.depth * self._service_s

    def enter(self) -> None:
        with self._lock:
            self.depth += 1

    def leave(self, engine_s: float | None) -> None:
        with self._lock:
            self.depth -= 1
            if engine_s is not None and engine_s > 0:
                self._service_s = 0.8 * self._service_s + 0.2 * engine_s


class RateLimiter:
    """A token bucket per caller: ``per_minute`` requests a minute, in bursts
    of up to a tenth of that (at least 5)."""

    def __init__(self, per_minute: int) -> None:
        self.rate = per_minute / 60.0
        self.burst = max(per_minute / 10.0, 5.0)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, caller: str) -> float:
        """0 if ``caller`` may go now, else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(caller, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens >= 1:
                self._buckets[caller] = (tokens - 1, now)
                return 0.0
            self._buckets[caller] = (tokens, now)
            return (1 - tokens) / self.rate


# -- metrics -----------------------------------------------------------------


class Metrics:
    """The service's Prometheus metrics, in their own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        buckets = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60)
        self.ttft = Histogram("rag_ttft_seconds", "Time to first token, retrieval and queue included", buckets=buckets, registry=r)
        self.total = Histogram("rag_request_seconds", "Whole request time", buckets=buckets, registry=r)
        self.prefill_rate = Histogram("rag_prefill_tokens_per_second", "Prompt tokens evaluated per second",
                                      buckets=(25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800), registry=r)
        self.decode_rate = Histogram("rag_decode_tokens_per_second", "Answer tokens per second",
                                     buckets=(10, 25, 50, 100, 200, 400, 800, 1600), registry=r)
        self.cached_ratio = Histogram("rag_cached_token_ratio", "Share of prompt tokens found in the KV cache",
                                      buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0), registry=r)
        self.queue_depth = Gauge("rag_queue_depth", "Requests waiting for or using the engine", registry=r)
        self.requests = Counter("rag_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r)
        self.over_target = Counter("rag_requests_over_target", "Requests whose TTFT exceeded their target", registry=r)

    def observe(self, answer: Answer) -> None:
        t = answer.timings
        self.ttft.observe(t.ttft_s)
        self.total.observe(t.total_s)
        if t.prefill_s > 0 and t.prefill_tokens > 1:
            self.prefill_rate.observe(t.prefill_tokens / t.prefill_s)
        if t.decode_s > 0 and t.decode_tokens > 1:
            self.decode_rate.observe(t.decode_tokens / t.decode_s)
        if t.prompt_tokens:
            self.cached_ratio.observe(t.cached_tokens / t.prompt_tokens)
        target = answer.budget.target_ttft_s
        if target is not None and t.ttft_s > target:
            self.over_target.inc()


# -- the app -------------------------------------------------------------------


class _Rejected(Exception):
    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after


def create_app(pipeline: Pipeline, settings: ServiceSettings | None = None) -> FastAPI:
    """The FastAPI application serving ``pipeline``."""
    settings = settings or ServiceSettings()
    metrics = Metrics()
    queue = EngineQueue()
    limiter = RateLimiter(settings.rate_limit_per_minute)
    ingesting = asyncio.Lock()  # one ingest at a time; queries go on meanwhile
    app = FastAPI(title="rag-budget", version="1", description="Local document QA that treats the prompt as a cost.")
    app.state.pipeline, app.state.settings, app.state.metrics, app.state.queue = pipeline, settings, metrics, queue

    def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(422, f"invalid request body: {where or 'body'}: {first.get('msg', 'invalid')}", "invalid_request")

    @app.exception_handler(StarletteHTTPException)  # FastAPI's and the router's (404, 405) alike
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 429: "rate_limited"}.get(exc.status_code, "http_error")
        return error(exc.status_code, str(exc.detail), kind, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # never a stack trace to the client
        return error(500, f"internal error: {type(exc).__name__}", "internal_error")

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):
        limit = settings.max_upload_bytes + 65536 if request.url.path == "/v1/documents" else settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return error(413, f"request body over {limit} bytes", "too_large")
        return await call_next(request)

    def authorised(request: Request) -> None:
        caller = f"addr:{request.client.host if request.client else '?'}"
        if settings.api_keys:
            header = request.headers.get("authorization", "")
            scheme, _, key = header.partition(" ")
            if scheme.lower() != "bearer" or not any(hmac.compare_digest(key.strip(), k) for k in settings.api_keys):
                raise HTTPException(401, "missing or wrong API key: send Authorization: Bearer KEY",
                                    headers={"WWW-Authenticate": "Bearer"})
            caller = f"key:{key.strip()}"
        wait = limiter.take(caller)
        if wait > 0:
            metrics.requests.labels(request.url.path, "rate_limited").inc()
            raise HTTPException(429, f"rate limit of {settings.rate_limit_per_minute} requests a minute reached; "
                                f"retry in {math.ceil(wait)} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})

    def start(question: str, *, target: float | None, session: str | None, max_tokens: int) -> Iterator[str | Answer]:
        """The pipeline's stream, planned with the expected queue wait; raises
        _Rejected when that wait alone would exceed the target."""
        if max_tokens > settings.max_tokens_limit:
            raise RagError(f"max_tokens {max_tokens} is over this server's limit of {settings.max_tokens_limit}")
        wait = queue.expected_wait() if settings.load_aware else 0.0
        goal = target if target is not None else default_target_ttft()
        options: dict = dict(target_ttft=target, session=session, max_tokens=max_tokens, expected_wait_s=wait)
        if goal is not None and wait > goal:
            if settings.reject_over_target:
                raise _Rejected(wait - goal)
            options["max_k"], options["min_k"] = 1, 1  # serve it with the least context
        return pipeline.stream(question, **options)

    async def run(endpoint: str, make: Iterator[str | Answer]) -> AsyncIterator[str | Answer]:
        """The pipeline's stream, run on its own thread and handed over item
        by item. When the consumer stops early (a client that went away),
        the thread closes the stream after the piece in progress, which
        ends the generation and frees the engine."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def hand_over(kind: str, value: object) -> None:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, (kind, value))
            except RuntimeError:
                pass  # the event loop is gone (shutdown): nobody to tell

        def produce() -> None:
            engine_s = None
            try:
                for item in make:
                    if isinstance(item, Answer):
                        engine_s = item.timings.total_s - item.timings.queue_s
                    hand_over("item", item)
                    if stop.is_set():
                        break
            except BaseException as exc:  # noqa: BLE001 - re-raised on the consumer's side
                hand_over("error", exc)
            finally:
                make.close()  # on this thread: a generator is closed where it runs
                queue.leave(engine_s)
                metrics.queue_depth.set(queue.depth)
                hand_over("done", None)

        queue.enter()
        metrics.queue_depth.set(queue.depth)
        threading.Thread(target=produce, name="rag-request", daemon=True).start()
        try:
            while True:
                kind, value = await inbox.get()
                if kind == "done":
                    break
                if kind == "error":
                    raise value
                if isinstance(value, Answer):
                    metrics.observe(value)
                    metrics.requests.labels(endpoint, "ok").inc()
                yield value
        finally:
            stop.set()

    async def last_answer(items: AsyncIterator[str | Answer]) -> Answer:
        """Run a stream to its end; its final Answer."""
        answer = None
        async for item in items:
            if isinstance(item, Answer):
                answer = item
        assert answer is not None
        return answer

    def rejected(endpoint: str, exc: _Rejected) -> JSONResponse:
        metrics.requests.labels(endpoint, "rejected").inc()
        seconds = max(1, math.ceil(exc.retry_after))
        return error(429, f"the engine is busy: the expected wait exceeds the TTFT target; retry in {seconds} s",
                     "overloaded", {"Retry-After": str(seconds)})

    def user_error(endpoint: str, exc: RagError) -> JSONResponse:
        metrics.requests.labels(endpoint, "bad_request").inc()
        return error(413 if isinstance(exc, QuestionTooLong) else 400, str(exc), "invalid_request")

    @app.get("/healthz")
    async def healthz() -> dict:
        """Liveness: the service answers, with its queue depth."""
        return {"status": "ok", "queue_depth": queue.depth}

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/ask", dependencies=[Depends(authorised)])
    async def ask(body: AskBody):
        """Answer a question from the index: the ``rag ask --json`` object,
        or with ``stream`` server-sent events of ``{"delta": text}`` then
        ``{"answer": {...}}``."""
        try:
            stream = start(body.question, target=body.target_ttft_s, session=body.session, max_tokens=body.max_tokens)
            items = run("ask", stream)
            if not body.stream:
                return (await last_answer(items)).to_dict()
            first = await items.__anext__()  # errors before the first token are still HTTP errors
        except _Rejected as exc:
            return rejected("ask", exc)
        except RagError as exc:
            return user_error("ask", exc)

        async def events() -> AsyncIterator[str]:
            item = first
            try:
                while True:
                    if isinstance(item, Answer):
                        yield _sse({"answer": item.to_dict()})
                    else:
                        yield _sse({"delta": item})
                    try:
                        item = await items.__anext__()
                    except StopAsyncIteration:
                        break
                    except RagError as exc:
                        yield _sse({"error": {"message": str(exc), "type": "invalid_request"}})
                        break
            finally:
                await items.aclose()  # a client that left stops its generation

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/documents", dependencies=[Depends(authorised)])
    async def upload(file: UploadFile = File(..., description="A .txt, .md, .rst, .html or .pdf file")):
        """Upload a document and ingest it (incremental and atomic: queries
        meanwhile run on the index as it was)."""
        data = await file.read(settings.max_upload_bytes + 1)
        if len(data) > settings.max_upload_bytes:
            return error(413, f"upload over {settings.max_upload_bytes} bytes", "too_large")
        async with ingesting:
            try:
                report = await run_in_threadpool(pipeline.add_document, file.filename or "", data)
            except RagError as exc:
                return error(400, str(exc), "invalid_request")
        if report.failed:
            return error(422, f"{report.failed[0][0]}: {report.failed[0][1]}", "unreadable_document")
        docs = await run_in_threadpool(pipeline.documents)
        mine = [d for d in docs if Path(str(d["root"])).resolve() == pipeline.uploads_dir.resolve()
                and d["source"] in set(report.added + report.updated + report.skipped)]
        return {"documents": mine, "report": report.counts()}

    @app.get("/v1/documents", dependencies=[Depends(authorised)])
    async def list_documents():
        """Every document in the index."""
        try:
            return {"documents": await run_in_threadpool(pipeline.documents)}
        except RagError as exc:
            return error(404, str(exc), "not_found")

    @app.delete("/v1/documents/{doc_id}", dependencies=[Depends(authorised)])
    async def delete_document(doc_id: str):
        """Remove a document from the index (atomically) and, if uploaded, its file."""
        async with ingesting:
            try:
                return {"deleted": await run_in_threadpool(pipeline.remove_document, doc_id)}
            except DocumentNotFound as exc:
                return error(404, str(exc), "not_found")

    @app.post("/v1/chat/completions", dependencies=[Depends(authorised)])
    async def chat_completions(body: ChatBody):
        """OpenAI-compatible chat completion of the last user message,
        answered from the index; ``sources`` lists what it came from."""
        users = [m for m in body.messages if m.role == "user" and _text(m.content).strip()]
        if not users:
            return error(400, "no user message with text in messages", "invalid_request")
        question = _text(users[-1].content)
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        model = pipeline.backend.name
        try:
            stream = start(question, target=body.target_ttft_s, session=body.session or body.user, max_tokens=max_tokens)
            items = run("chat", stream)
            if not body.stream:
                return _completion(await last_answer(items), cid, created, model, max_tokens)
            first = await items.__anext__()
        except _Rejected as exc:
            return rejected("chat", exc)
        except RagError as exc:
            return user_error("chat", exc)

        async def chunks() -> AsyncIterator[str]:
            base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            yield _sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            item = first
            try:
                while True:
                    if isinstance(item, Answer):
                        final = _completion(item, cid, created, model, max_tokens)
                        reason = final["choices"][0]["finish_reason"]
                        yield _sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
                                           "usage": final["usage"], "sources": final["sources"]})
                    else:
                        yield _sse(base | {"choices": [{"index": 0, "delta": {"content": item}, "finish_reason": None}]})
                    try:
                        item = await items.__anext__()
                    except StopAsyncIteration:
                        break
            finally:
                await items.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def _sse(obj: object) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _completion(answer: Answer, cid: str, created: int, model: str, max_tokens: int) -> dict:
    t = answer.timings
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{
            "index": 0, "message": {"role": "assistant", "content": answer.answer},
            "finish_reason": "length" if t.decode_tokens >= max_tokens else "stop",
        }],
        "usage": {
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.decode_tokens,
            "total_tokens": t.prompt_tokens + t.decode_tokens,
            "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
        },
        "sources": [s.to_dict() for s in answer.sources],
        "rag": {"budget": answer.budget.to_dict(), "timings": t.to_dict(), "session": answer.session, "turn": answer.turn},
    }


class LoopbackServer:
    """``app`` served by uvicorn on 127.0.0.1, on a free port, in a thread
    (for tests and benchmarks); ``url`` is where, ``stop()`` ends it."""

    def __init__(self, app: FastAPI, start_timeout_s: float = 60) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="rag-loopback-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start on 127.0.0.1")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        """Shut the server down and wait for it."""
        self.server.should_exit = True
        self.thread.join(timeout=60)


def serve(pipeline: Pipeline, settings: ServiceSettings) -> None:
    """Run the service until interrupted."""
    import uvicorn

    settings.check()
    pipeline.index()
    pipeline.cost_model  # load and calibrate before the first request, not during it
    pipeline.warm_up()
    uvicorn.run(create_app(pipeline, settings), host=settings.host, port=settings.port, log_level="info")


