"""Warming the service up before it takes questions: the model, the index,
the cost model, the system prompt's KV state and one rehearsal of a question
(see ``Pipeline.prepare``), on a thread of its own once the server listens,
so ``/healthz`` can say "warming" meanwhile.

Requests that need the pipeline wait for the warm-up (they are neither
answered nor timed before it ends); ``/healthz`` and ``/metrics`` do not.

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


class WarmUp:
    """The service's warm-up: not started, running, done, or failed (then
    every request that needs the pipeline gets its error)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.done = threading.Event()
        self.error: RagError | None = None
        self.seconds: float | None = None
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
            self.pipeline.prepare(need_index=False)  # the first documents may come by upload
        except RagError as exc:
            self.error = exc
            print(f"error: the service could not warm up: {exc}", file=sys.stderr, flush=True)
        finally:
            self.seconds = time.perf_counter() - began
            self.done.set()

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
