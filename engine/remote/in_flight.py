"""What a new request meets on a server, as this client can know it: the
requests it has in flight there, and what each of them has made a newcomer
wait.

The OpenAI API says nothing of a server's queue, so a :class:`RemoteBackend`
counts its own requests. Where the server reports its own clock
(llama-server's ``prompt_ms``, vLLM's per-request metrics), a request's
first token came ``ttft - prefill`` seconds later than its prefill alone
explains: that wait, over the requests in flight when it was sent, is
learned (a moving average) and a newcomer is expected to wait that much
per request in flight. Before any is learned, a server with ``parallel``
slots (over every worker behind a router) is taken to make a newcomer wait
for none while one is free, else for those beyond them, each as long as a
request has lately held it, shared among the slots. A server that other
clients also use is busier than this says.

Does not: talk to the server, or decide anything (the planner does, from
the :class:`~engine.scheduler.Ahead` it reports).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from ..scheduler import Ahead

# Seconds a request is taken to hold a server before any has been timed: one answer of a small model.
FIRST_SERVICE_S = 1.0
# How much of the moving average of a request's time there each new one makes up.
SERVICE_WEIGHT = 0.2


class InFlight:
    """The requests this client has in flight on a server serving
    ``parallel`` at once, and a moving average of how long one holds it.
    Thread safe."""

    def __init__(self, parallel: int = 1, service_s: float = FIRST_SERVICE_S) -> None:
        self.parallel = max(int(parallel), 1)
        self._lock = threading.Lock()
        self._count = 0
        self._service_s = service_s
        self._wait_per_ahead: float | None = None  # learned from the server's own clock; None: not yet

    @property
    def count(self) -> int:
        """Requests in flight now."""
        with self._lock:
            return self._count

    @property
    def service_s(self) -> float:
        """Seconds a request has lately held the server, on a moving average."""
        with self._lock:
            return self._service_s

    def ahead(self) -> Ahead:
        """What a request sent now meets: the wait for a free slot.

        ``InFlight(parallel=2)`` with 4 in flight, nothing timed: ``ahead().wait_s == 1.5``
        """
        with self._lock:
            if self._wait_per_ahead is not None:
                return Ahead(wait_s=self._count * self._wait_per_ahead)
            beyond = max(self._count - self.parallel + 1, 0)
            return Ahead(wait_s=beyond * self._service_s / self.parallel)

    def learn_wait(self, ahead: int, waited_s: float) -> None:
        """A request sent with ``ahead`` others in flight waited
        ``waited_s`` seconds beyond its own prefill for its first token, by
        the server's clock: what each request in flight costs a newcomer
        there, as measured (slots that share one CPU slow each other; a
        GPU's batch barely does)."""
        if ahead < 1:
            return  # nothing ahead: the wait is the network's, not the queue's
        per = max(waited_s, 0.0) / ahead
        with self._lock:
            learned = self._wait_per_ahead
            self._wait_per_ahead = per if learned is None else (1 - SERVICE_WEIGHT) * learned + SERVICE_WEIGHT * per

    def enter(self) -> int:
        """One request more in flight; how many others were in flight when it was sent."""
        with self._lock:
            self._count += 1
            return self._count - 1

    def leave(self, seconds: float | None) -> None:
        """One request fewer in flight; it held the server ``seconds`` (None: not known)."""
        with self._lock:
            self._count -= 1
            if seconds is not None:
                self._service_s = (1 - SERVICE_WEIGHT) * self._service_s + SERVICE_WEIGHT * seconds

    @contextlib.contextmanager
    def holding(self) -> Iterator[int]:
        """One request in flight while the block runs, timed when it ends;
        gives how many others were in flight when it was sent."""
        started = time.perf_counter()
        ahead = self.enter()
        try:
            yield ahead
        finally:
            self.leave(time.perf_counter() - started)
