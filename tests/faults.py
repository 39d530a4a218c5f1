"""Faults made repeatable: a real HTTP proxy on 127.0.0.1 in front of a real
engine server, that can cut a completion stream off midway (an engine that
dies mid-answer); and, for the in-process engine, the real model with its
native context and KV stores failing where a test says (``engine.llama_cpp.faults``),
with the checks every test of it makes: each request ends, told, and the
engine settles with every sequence and KV cell accounted for."""

from __future__ import annotations

import queue

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rag.service.loopback import LoopbackServer


class CuttingProxy:
    """Forwards every request to ``upstream``; while ``cut_after`` is set, a
    streamed ``/v1/completions`` answer is broken off (the connection
    dropped) after that many events."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.cut_after: int | None = None
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])
        self._server = LoopbackServer(app)
        self.url = self._server.url

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        client = httpx.AsyncClient(base_url=self.upstream, timeout=120)
        upstream = await client.send(client.build_request(request.method, request.url.path, content=body,
                                                          headers=headers), stream=True)
        cut = self.cut_after if request.url.path == "/v1/completions" else None

        async def relay():
            events = 0
            try:
                async for line in upstream.aiter_lines():
                    yield line + "\n"
                    if line.startswith("data:"):
                        events += 1
                        if cut is not None and events >= cut:
                            raise ConnectionAbortedError("the engine went away")  # uvicorn drops the connection
            finally:
                await upstream.aclose()
                await client.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    def stop(self) -> None:
        """Stop the proxy."""
        self._server.stop()


HANG_S = 60  # a hang guard, not a timing claim: no step here takes a fraction of it


def faulty_backend(**options):
    """A real :class:`~engine.llama_cpp.backend.LlamaCppBackend` (the bundled
    model) with ``engine.llama_cpp.faults`` wrapped around its context and stores, and
    no fault planned yet; its :class:`~engine.llama_cpp.faults.Faults` is ``.faults``."""
    from engine.llama_cpp.faults import Faults, inject
    from engine.llama_cpp.backend import LlamaCppBackend

    backend = LlamaCppBackend(**options)
    backend.faults = inject(backend, Faults())
    return backend


def outcome(request, wait_s: float = HANG_S) -> tuple[str, object]:
    """How a request submitted to an engine loop ended: ("done", Timings) or
    ("error", EngineError), its pieces skipped; AssertionError if it was
    never told within ``wait_s`` (it hangs)."""
    while True:
        try:
            kind, value = request.events.get(timeout=wait_s)
        except queue.Empty:
            raise AssertionError(f"request {request.key} was never told how it ended") from None
        if kind != "piece":
            return kind, value


def settled(loop, wait_s: float = HANG_S) -> None:
    """Wait until ``loop`` is idle; every sequence and KV cell accounted for
    (``engine.llama_cpp.faults.settle``), else AssertionError."""
    from engine.llama_cpp.faults import settle

    settle(loop, wait_s)
