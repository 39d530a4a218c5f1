"""Warming the service up before it takes questions: the model, the index,
the cost model, the system prompt's KV state and one rehearsal of a question
(see ``Pipeline.prepare``), on a thread of its own once the server listens,
so ``/healthz`` can say "warming" meanwhile.

Requests that need the pipeline wait for the warm-up (they are neither
answered nor timed before it ends); ``/healthz`` and ``/metrics`` do not.
A warm-up that fails (whatever the error) is tried again a bounded number
of times; if it never works, ``/healthz`` says "error" with why and each
such request is answered 503 with it.

Does not: decide when a request is refused (admission does).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from ..errors import RagError
from ..qa.pipeline import Pipeline

WAIT_FOR_WARM_UP_S = 600.0  # a request waiting longer is told the service is not ready
WARM_UP_TRIES = 3  # tries of ``prepare`` before the warm-up is given up (chosen)
RETRY_BACKOFF_S = 2.0  # seconds before the second try, doubled before each next (chosen)


class WarmUpFailed(RagError):
    """The service could not warm up: every request that needs the pipeline
    is answered 503 with why, until the service is restarted."""


class WarmUp:
    """The service's warm-up: not started, running, done, or failed (then
    every request that needs the pipeline gets its error).

    Any failure (an engine's, a database's, the disk's) is caught, logged and
    tried again, at most ``WARM_UP_TRIES`` times, ``RETRY_BACKOFF_S`` apart
    and doubling; after the last, ``/healthz`` says "error" with why, and
    requests are refused with it rather than each running ``prepare`` again."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.done = threading.Event()
        self.error: WarmUpFailed | None = None
        self.seconds: float | None = None
        self.tries = 0
        self._started = False
        self._lock = threading.Lock()

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

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            failure = None
            for self.tries in range(1, WARM_UP_TRIES + 1):
                if self.tries > 1:
                    time.sleep(RETRY_BACKOFF_S * 2 ** (self.tries - 2))
                failure = self._try()
                if failure is None:
                    return
            self.error = WarmUpFailed(f"the service could not warm up ({self.tries} tries): {failure}")
            print(f"error: {self.error}", file=sys.stderr, flush=True)
        finally:
            self.seconds = time.perf_counter() - began
            self.done.set()

    def _try(self) -> str | None:
        """One try at preparing the pipeline: None if it worked, else why not."""
        try:
            self.pipeline.prepare(need_index=False)  # the first documents may come by upload
            return None
        except Exception as exc:  # noqa: BLE001 - any failure is said, never a silent "ok"
            why = str(exc) if isinstance(exc, RagError) else f"{type(exc).__name__}: {exc}"
            print(f"warning: warm-up try {self.tries} of {WARM_UP_TRIES} failed: {why}", file=sys.stderr, flush=True)
            return why

    def wait(self, timeout: float | None = WAIT_FOR_WARM_UP_S) -> bool:
        """Block until the warm-up ended (started if it was not); whether it did in time."""
        self.start()
        return self.done.wait(timeout)

    async def ready(self) -> None:
        """Wait (without holding the event loop) until the warm-up ended;
        raises its error, or RagError if it took too long."""
        self.start()
        if not self.done.is_set():
            ended = await asyncio.to_thread(self.done.wait, WAIT_FOR_WARM_UP_S)
            if not ended:
                raise RagError("the service is still warming up; try again shortly")
        if self.error is not None:
            raise self.error
