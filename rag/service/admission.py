"""Who gets the engine, and with how much context: the service's
admission policy, pure, and the queue figures it decides from.

A request is planned with the wait expected ahead of it, so under load it
takes fewer chunks. One whose wait alone would exceed its target is refused
(429 with ``Retry-After``) or, if the service is set so, served with the
least context.

Does not: run requests or talk HTTP.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    """What to do with a request: serve it (planning for ``expected_wait_s``,
    with the least context when ``least_context``) or refuse it, to be
    retried after ``retry_after_s``."""

    admit: bool
    expected_wait_s: float = 0.0
    least_context: bool = False
    retry_after_s: float = 0.0


def admit(expected_wait_s: float, target_ttft: float | None, *, load_aware: bool, reject_over_target: bool) -> Admission:
    """The decision for a request with ``target_ttft`` (None: no target)
    arriving when the engine is expected to be busy for ``expected_wait_s``.

    ``admit(3.0, 2.0, load_aware=True, reject_over_target=True) == Admission(False, retry_after_s=1.0)``
    """
    wait = expected_wait_s if load_aware else 0.0
    if target_ttft is None or wait <= target_ttft:
        return Admission(True, expected_wait_s=wait)
    if reject_over_target:
        return Admission(False, retry_after_s=wait - target_ttft)
    return Admission(True, expected_wait_s=wait, least_context=True)


class EngineQueue:
    """How many requests are waiting for or using the engine, and how long
    one takes there, to predict a newcomer's wait. Thread safe."""

    def __init__(self, service_s: float = 1.0) -> None:
        self._lock = threading.Lock()
        self.depth = 0
        self._service_s = service_s  # a moving average of time on the engine per request
        # Learned from answers: seconds of first-token wait each request ahead of one added (None: none yet).
        self._wait_per_ahead: float | None = None

    def expected_wait(self, parallel: int = 1) -> float:
        """Seconds a request arriving now is expected to wait for its first
        token beyond what its prompt costs an idle engine: once answers have
        taught it (:meth:`learn_wait`), the learned wait per request ahead
        times those ahead; before, as an engine serving ``parallel`` at once
        (a server's slots, over every worker behind a router) would: none
        while one is free, else those ahead of it shared among them.

        ``EngineQueue(service_s=1.0)`` with 4 in it, nothing learned:
        ``expected_wait() == 4.0``, ``expected_wait(parallel=8) == 0.0``,
        ``expected_wait(parallel=2) == 1.5``
        """
        parallel = max(int(parallel), 1)
        with self._lock:
            if self._wait_per_ahead is not None:
                return self.depth * self._wait_per_ahead
            return max(self.depth - parallel + 1, 0) * self._service_s / parallel

    def learn_wait(self, ahead: int, waited_s: float) -> None:
        """An answer admitted with ``ahead`` requests in the queue waited
        ``waited_s`` seconds for its first token beyond its idle-engine
        prediction: what each request ahead costs a newcomer on this engine,
        as measured (slots that share one CPU slow each other; a GPU's
        batch barely does), not as assumed."""
        if ahead < 1:
            return  # nothing ahead: its miss is the prediction's, not the queue's
        waited_s = max(waited_s, 0.0)
        with self._lock:
            per = waited_s / ahead
            self._wait_per_ahead = per if self._wait_per_ahead is None else 0.8 * self._wait_per_ahead + 0.2 * per

    @property
    def service_s(self) -> float:
        """Seconds a request holds the engine, on average of late."""
        with self._lock:
            return self._service_s

    def enter(self) -> None:
        """A request starts waiting for the engine."""
        with self._lock:
            self.depth += 1

    def leave(self, engine_s: float | None) -> None:
        """A request is done; ``engine_s`` is how long it held the engine (None if unknown)."""
        with self._lock:
            self.depth -= 1
            if engine_s is not None and engine_s > 0:
                self._service_s = 0.8 * self._service_s + 0.2 * engine_s
