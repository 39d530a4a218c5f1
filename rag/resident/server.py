"""The resident server process: the service's application (``rag.service``)
for one set-up, on a Unix socket that only its user can open, with
everything loaded before the socket appears, until it has been idle for
``server_idle_s``.

Started by the client as ``python -m rag.resident.server KEY`` with the
resolved settings as JSON in ``RAG_RESIDENT_SETTINGS``; it holds the key's
lock for its whole life (a second server of the same key exits at once with
``EXIT_ALREADY_RUNNING``), writes its errors as one ``error:`` line to its
log for the client to show, and removes its socket when it ends.

Besides the service's routes it answers ``GET /v1/resident`` (who it is,
requests served, idle time, whether it is stopping),
``GET /v1/resident/background`` (its background work, as ``rag chat``'s
``/stats`` shows it) and ``POST /v1/resident/stop``.

Stopping (idle, or told to) is decided on the event loop, where requests
are admitted too, so the two never race: once it has decided, every new
request is refused with 503 ``server_stopping`` before anything is done
for it (the client then asks a fresh server), and it only decides to stop
when idle while nothing is in flight; the answers in progress are finished.

Does not: listen on TCP, start itself (the client does) or answer by
itself (the service's routes and the pipeline do).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request

from engine.backend import StepCounters

from ..errors import RagError
from ..index.location import shown
from ..qa.pipeline import Pipeline
from ..service import ServiceSettings, create_app
from ..settings import Settings
from . import wire
from .address import EXIT_ALREADY_RUNNING, PROTOCOL, SETTINGS_VARIABLE, Address, held, sweep_stale

QUIET = frozenset({"/healthz", "/v1/resident", "/v1/resident/background", "/v1/resident/stop"})  # not activity
LOCK_PATIENCE_S = 1.0  # a client asking whether a server lives holds its lock for an instant, never this long


@dataclass
class Life:
    """What the server has done and how long it has been idle."""

    address: Address
    idle_timeout_s: float
    started_at: float = field(default_factory=time.time)
    requests: int = 0
    in_flight: int = 0
    last_activity: float = field(default_factory=time.monotonic)
    notes: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    stopping: bool = False  # decided to stop: every new request is refused (503 server_stopping)
    server: object = None  # the uvicorn server, told to exit by /v1/resident/stop
    library: object = None  # the pipeline's DocumentLibrary: its ingests are stopped with the server

    def idle_for(self) -> float:
        """Seconds since the last request ended (0 while one runs)."""
        return 0.0 if self.in_flight else time.monotonic() - self.last_activity

    def stop(self, why: str) -> None:
        """Decide to stop: new requests are refused from now on, the ones in
        flight are finished, then the server exits."""
        if not self.stopping:
            print(f"{why}: stopping", file=sys.stderr, flush=True)
        self.stopping = True
        if self.library is not None:
            self.library.stop_ingests()  # uvicorn waits for the requests in flight: an upload's ingest must end
        self.server.should_exit = True

    def note(self, message: str) -> None:
        """Something the pipeline did on its own or found wrong: to the log and the status."""
        self.notes.append(message)
        print(f"note: {message}", file=sys.stderr, flush=True)


STOPPING = json.dumps({"error": {"message": "the rag server is stopping; ask another",
                                  "type": wire.STOPPING}}).encode("utf-8")


class Tracked:
    """ASGI middleware: counts requests and the time since the last one
    ended, refuses every request once the server decided to stop (503
    ``server_stopping``: nothing was done for it). A generation another
    process published (``rag ingest`` in another shell) is opened by the
    pipeline itself at the next question (``Components.index``)."""

    def __init__(self, app, life: Life, pipeline: Pipeline) -> None:
        self.app, self.life, self.pipeline = app, life, pipeline

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in QUIET:
            await self.app(scope, receive, send)
            return
        life = self.life
        if life.stopping:
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(STOPPING)).encode("ascii"))]})
            await send({"type": "http.response.body", "body": STOPPING})
            return
        # No await between the check above and this count: the idle check (on
        # the same loop) sees either a request in flight or a stopping server.
        life.requests += 1
        life.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            life.in_flight -= 1
            life.last_activity = time.monotonic()


resident = APIRouter()


@resident.get("/v1/resident")
async def status(request: Request) -> dict:
    """Who this server is: pid, key, socket, set-up, requests served, idle
    time, and its engine's step counters where it keeps them (``engine_stats``)."""
    life: Life = request.app.state.life
    pipeline: Pipeline = request.app.state.pipeline
    backend = pipeline.components.loaded_backend
    engine_stats = backend.engine_stats if isinstance(backend, StepCounters) else None
    return {
        "pid": os.getpid(), "key": life.address.key, "protocol": PROTOCOL, "socket": str(life.address.socket),
        "log": str(life.address.log), "started_at": life.started_at, "uptime_s": time.time() - life.started_at,
        "requests": life.requests, "in_flight": life.in_flight, "idle_s": life.idle_for(),
        "idle_timeout_s": life.idle_timeout_s, "stopping": life.stopping, "index": shown(pipeline.index_location),
        "sample": pipeline.use_sample,
        "model": str(pipeline.settings.model) if pipeline.settings.model else None,
        "engine": backend.name if backend is not None else None, "notes": list(life.notes),
        "engine_stats": engine_stats() if engine_stats is not None else None,
    }


@resident.get("/v1/resident/background")
async def background(request: Request) -> dict:
    """The latest background work (summaries, prefills), each with its session, oldest first."""
    return {"background": request.app.state.pipeline.background_log}


@resident.post("/v1/resident/stop")
async def stop(request: Request) -> dict:
    """Stop once the answers in progress are finished; new requests are refused from now on."""
    life: Life = request.app.state.life
    life.stop("told to stop")
    return {"stopping": os.getpid(), "in_flight": life.in_flight}


def resident_settings() -> ServiceSettings:
    """The service's settings as the command line needs them: no keys, even
    where the shell exports the service's (its one client sends none; the
    socket's file mode is its guard), no rate limit, no cap on answer
    tokens beyond the context, every request answered even when late (as
    in process)."""
    return ServiceSettings(api_keys=[], keys_file=None, watch=[], rate_limit_per_minute=0,
                           max_tokens_limit=1 << 30, reject_over_target=False)


def resident_app(pipeline: Pipeline, life: Life) -> FastAPI:
    """The service's application for ``pipeline`` with :func:`resident_settings`,
    the resident routes and the request tracking."""
    app = create_app(pipeline, resident_settings(), audience="shell")  # its client prints errors as the CLI words them
    app.state.life = life
    app.include_router(resident)
    app.add_middleware(Tracked, life=life, pipeline=pipeline)
    return app


def bind(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 (in a 0700 folder);
    a stale one there is replaced (the caller holds the key's lock, so no
    live server owns it)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


async def _stop_when_idle(life: Life, pipeline: Pipeline) -> None:
    tick = min(1.0, max(0.05, life.idle_timeout_s / 10))
    while not life.server.should_exit:
        await asyncio.sleep(tick)
        # A summary still being written in the background is not idleness.
        if life.idle_for() >= life.idle_timeout_s and not pipeline.background_busy():
            life.stop(f"idle for {life.idle_timeout_s:g} s")


async def _run(app: FastAPI, sock: socket.socket, life: Life, pipeline: Pipeline) -> None:
    import uvicorn

    from ..service.watching import stop_ingests_on_exit

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    stop_ingests_on_exit(server, pipeline.library)  # SIGTERM does not wait for an upload's ingest
    life.server, life.library = server, pipeline.library
    life.last_activity = time.monotonic()  # idle from now: loading took its time, and no client has been served yet
    idle = asyncio.create_task(_stop_when_idle(life, pipeline))
    try:
        await server.serve(sockets=[sock])
    finally:
        idle.cancel()


def serve(settings: Settings, key: str) -> int:
    """Run the resident server of ``settings`` until it is stopped or idle;
    the exit status (1 with an ``error:`` line on stderr when it cannot
    start; EXIT_ALREADY_RUNNING when a server of this key already lives)."""
    address = Address.of(settings)
    if address.key != key:  # the settings did not survive the trip from the client
        print(f"error: the rag server was started for set-up {key} but its settings make {address.key}",
              file=sys.stderr, flush=True)
        return 1
    with held(address.lock, patience_s=LOCK_PATIENCE_S) as fd:
        if fd is None:
            return EXIT_ALREADY_RUNNING
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode("ascii"))
        for key in sweep_stale(address.folder, keep=address.key):  # what killed servers left
            print(f"removed the socket and lock files of server {key}, which is gone", file=sys.stderr, flush=True)
        life = Life(address, settings.server_idle_s)
        try:
            pipeline = Pipeline.open(settings=settings, notice=life.note)
            pipeline.prepare()  # loaded before the socket appears: the first question does not wait for it
        except RagError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
        sock = bind(address.socket)
        print(f"ready: pid {os.getpid()} on {address.socket}", file=sys.stderr, flush=True)
        try:
            asyncio.run(_run(resident_app(pipeline, life), sock, life, pipeline))
        finally:
            with contextlib.suppress(FileNotFoundError):
                address.socket.unlink()  # before the lock goes: a client seeing no lock finds no socket
            sock.close()
            pipeline.close()
    return 0


def main() -> None:
    """``python -m rag.resident.server KEY``, settings in ``RAG_RESIDENT_SETTINGS``."""
    settings = Settings.model_validate_json(os.environ.pop(SETTINGS_VARIABLE, "{}"))
    sys.exit(serve(settings, sys.argv[1] if len(sys.argv) > 1 else ""))


if __name__ == "__main__":
    main()
