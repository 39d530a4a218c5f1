"""Warming the service up before it takes questions: the model, the index,
the cost model, the system prompt's KV state and one rehearsal of a question
(see ``Pipeline.prepare``), on a thread of its own once the server listens,
so ``/healthz`` can say "warming" meanwhile.

Requests that need the pipeline wait for the warm-up (they are neither
answered nor timed before it ends); ``/healthz`` and ``/metrics`` do not.
A warm-up that fails (whatever the error) is tried again a few times,
seconds apart; if those fail, ``/healthz`` says "error" with why and each such
request is answered 503 with it at once (none runs ``prepare`` itself) unless
the failure was the engine not answering (the request goes on to meet it),
while the warm-up goes on being tried in the background, further apart each
time (up to ``RETRY_BACKOFF_MAX_S``): a remote engine or a database that
comes up later finds the service healthy again without a restart.

Does not: decide when a request is refused (admission does).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from engine.errors import EngineUnreachable, GenerationFailed

from ..errors import EngineUnavailable, RagError
from ..qa.pipeline import Pipeline

WAIT_FOR_WARM_UP_S = 600.0  # a request waiting longer is told the service is not ready
WARM_UP_TRIES = 3  # quick tries of ``prepare`` before /healthz says "error" (chosen)
RETRY_BACKOFF_S = 2.0  # seconds before the second try, doubled before each next (chosen)
RETRY_BACKOFF_MAX_S = 60.0  # the longest wait between two tries, tried for ever at that pace (chosen)
# An engine that does not answer (a remote one down, one that broke off) may be back by the next
# request, which needs it anyway: such a request goes on and meets the engine's own error, or its answer.
ENGINE_DOWN = (EngineUnavailable, EngineUnreachable, GenerationFailed)


def retry_wait_s(tries: int) -> float:
    """Seconds to wait after ``tries`` failed tries before the next:
    ``RETRY_BACKOFF_S`` doubled after each, never more than ``RETRY_BACKOFF_MAX_S``."""
    return min(RETRY_BACKOFF_S * 2.0 ** max(tries - 1, 0), RETRY_BACKOFF_MAX_S)


class WarmUpFailed(RagError):
    """The service could not warm up (yet): every request that needs the
    pipeline is answered 503 with why, until a later try in the background
    works."""


class WarmUp:
    """The service's warm-up: not started, running, done, or failed (then
    every request that needs the pipeline gets its error, while it is tried
    again in the background).

    Any failure (an engine's, a database's, the disk's) is caught, logged and
    tried again: ``WARM_UP_TRIES`` times seconds apart (see :func:`retry_wait_s`);
    after those, ``/healthz`` says "error" with why, and requests are refused
    with it rather than each running ``prepare`` again, while the tries go on
    at most ``RETRY_BACKOFF_MAX_S`` apart until one works (then "ok") or
    :meth:`stop` is called."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.done = threading.Event()  # the first outcome is known: ok, or failed (and still tried)
        self.error: WarmUpFailed | None = None  # the latest failure while it is not warm; never raised itself
        self.engine_down = False  # that failure was the engine not answering (requests go on to it)
        self.seconds: float | None = None
        self.tries = 0
        self._started = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @property
    def status(self) -> str:
        """"warming", "ok", or "error"."""
        if not self.done.is_set():
            return "warming"
        return "ok" if self.error is None else "error"

    def start(self) -> None:
        """Begin warming up on a thread (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name="rag-warm-up", daemon=True).start()

    def stop(self) -> None:
        """Try no more (the service is closing): a try under way ends as it
        will, none follows it."""
        self._stopping.set()

    def _run(self) -> None:
        began = time.perf_counter()
        while not self._stopping.is_set():
            self.tries += 1
            failure = self._try()
            if failure is None:
                if self.error is not None:
                    print(f"the service warmed up after {self.tries} tries", file=sys.stderr, flush=True)
                self._ended(None, began)
                return
            wait_s = retry_wait_s(self.tries)
            if self.tries >= WARM_UP_TRIES:  # said on /healthz and to every request until a try works
                first = self.error is None
                self._ended(WarmUpFailed(f"the service could not warm up ({self.tries} tries; "
                                         f"the next in {wait_s:g} s): {failure}"), began)
                if first:
                    print(f"error: {self.error}", file=sys.stderr, flush=True)
            self._stopping.wait(wait_s)

    def _ended(self, error: WarmUpFailed | None, began: float) -> None:
        # The error is set before ``done``: a reader never sees "ok" for a warm-up that failed.
        self.error = error
        self.seconds = time.perf_counter() - began
        self.done.set()

    def _try(self) -> str | None:
        """One try at preparing the pipeline: None if it worked, else why not."""
        try:
            self.pipeline.prepare(need_index=False)  # the first documents may come by upload
            self.engine_down = False
            return None
        except Exception as exc:  # noqa: BLE001 - any failure is said, never a silent "ok"
            self.engine_down = isinstance(exc, ENGINE_DOWN)
            why = str(exc) if isinstance(exc, RagError) else f"{type(exc).__name__}: {exc}"
            print(f"warning: warm-up try {self.tries} failed: {why}", file=sys.stderr, flush=True)
            return why

    def wait(self, timeout: float | None = WAIT_FOR_WARM_UP_S) -> bool:
        """Block until the warm-up's first outcome (started if it was not); whether it came in time."""
        self.start()
        return self.done.wait(timeout)

    async def ready(self) -> None:
        """Wait (without holding the event loop) until the warm-up's first
        outcome; raises a new WarmUpFailed with why while it is not warm
        (never one instance for every request: its traceback would grow
        with each), or RagError if it took too long."""
        self.start()
        if not self.done.is_set():
            ended = await asyncio.to_thread(self.done.wait, WAIT_FOR_WARM_UP_S)
            if not ended:
                raise RagError("the service is still warming up; try again shortly")
        error = self.error  # read once: a try in the background may clear it meanwhile
        if error is not None and not self.engine_down:
            raise WarmUpFailed(str(error))
