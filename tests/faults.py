"""Faults made repeatable: a real HTTP proxy on 127.0.0.1 in front of a real
engine server, that can cut a completion stream off midway (an engine that
dies mid-answer); and, for the in-process engine, the real model with its
native context and KV stores failing where a test says (``engine.faults``),
with the checks every test of it makes: each request ends, told, and the
engine settles with every sequence and KV cell accounted for."""

from __future__ import annotations

import queue
import time

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
    """A real :class:`~engine.llama_cpp_backend.LlamaCppBackend` (the bundled
    model) with ``engine.faults`` wrapped around its context and stores, and
    no fault planned yet; its :class:`~engine.faults.Faults` is ``.faults``."""
    from engine.faults import Faults, inject
    from engine.llama_cpp_backend import LlamaCppBackend

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
    """Wait until ``loop`` holds and waits for nothing, then check that every
    sequence is free and the KV cache holds exactly what the loop says:
    the system prompt in sequence 0, each idle sequence its cached prompt,
    the splicing scratch nothing (cells conserved)."""
    from engine.placement import SYSTEM_SEQ

    deadline = time.monotonic() + wait_s
    while True:
        p = loop.published
        if (p.free == loop.slots.size and not p.active and not p.waiting and not p.warming
                and not loop.splicer.warm_size() and not loop._inbox):
            break
        assert time.monotonic() < deadline, f"the engine never settled: {p.free} of {loop.slots.size} sequences free"
        time.sleep(0.05)
    time.sleep(0.05)  # the loop publishes before it goes back to wait
    ctx = loop.ctx
    assert ctx.last_pos(SYSTEM_SEQ) == len(loop.system) - 1, "sequence 0 does not hold the system prompt"
    for seq, cells in loop.slots.holdings().items():
        assert ctx.first_pos(seq) == (0 if cells else -1) and ctx.last_pos(seq) == cells - 1, \
            f"sequence {seq} holds other cells than its cached prompt's {cells}"
    assert ctx.last_pos(loop.splicer.scratch) == -1, "the splicing scratch sequence was left holding cells"
