"""Questions on their way to the engine, and how often they come while
others are being answered: what a plan leaves room for behind it.

A plan made when the engine has nothing waiting would take the whole
target for its own passages; the questions asked a moment later then wait
behind that prefill. Those already asked are counted from the moment they
are asked (not when their thread reaches retrieval); those not yet asked
are expected at the recent rate of questions that arrived while another
was still being answered (one user asking in turn never overlaps, so it
leaves no room for itself).

Does not: plan prompts or measure the engine.
"""

from __future__ import annotations

import threading
import time
from collections import deque

# How far back the rate of overlapping arrivals is counted: long enough to hold several rounds of
# clients that ask again as soon as they are answered (8 clients: a round each 2-3 s), short enough
# to forget a burst that is over.
ARRIVAL_WINDOW_S = 10.0


class Arrivals:
    """Questions asked and not yet planned, those not yet answered, and the
    recent times at which a question arrived while another was not yet
    answered. Thread safe."""

    def __init__(self, window_s: float = ARRIVAL_WINDOW_S) -> None:
        self.unplanned = 0
        self.open = 0
        self.window_s = window_s
        self._overlapping: deque[float] = deque()
        # Reentrant: a stream dropped unread closes its arrival from a finalizer, which the garbage
        # collector may run on a thread that holds this lock.
        self._lock = threading.RLock()

    def arrive(self, now: float | None = None) -> "Arrival":
        """Count one more question, asked at ``now`` (default: now)."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            if self.open:
                self._overlapping.append(now)
            self._forget_before(now)  # here too: questions without a deadline never ask expected()
            self.unplanned += 1
            self.open += 1
        return Arrival(self)

    def expected(self, seconds: float, now: float | None = None) -> float:
        """Questions expected to arrive within ``seconds`` from ``now`` while
        others are answered: the rate of such arrivals over the last
        ``window_s`` times ``seconds``."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            self._forget_before(now)
            return len(self._overlapping) / self.window_s * max(seconds, 0.0)

    def _forget_before(self, now: float) -> None:
        """Drop the overlapping arrivals older than the window (called with the lock held)."""
        while self._overlapping and self._overlapping[0] < now - self.window_s:
            self._overlapping.popleft()

    def _done(self, planned: bool, answered: bool) -> None:
        with self._lock:
            self.unplanned -= planned
            self.open -= answered


class Arrival:
    """One question counted in :class:`Arrivals`: :meth:`planned` once its
    prompt is submitted, :meth:`close` (or leaving ``with arrival:``) when it
    ends however it ends; each counts once however often it is called."""

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals = arrivals
        self._lock = threading.RLock()  # reentrant, as above
        self._unplanned = self._open = True

    def planned(self) -> None:
        """Its prompt is submitted: in the engine's load from now, no longer on its way."""
        self._end(planned=True, answered=False)

    def close(self) -> None:
        """It ended: answered, failed, or never asked for."""
        self._end(planned=True, answered=True)

    def _end(self, planned: bool, answered: bool) -> None:
        with self._lock:
            planned, answered = planned and self._unplanned, answered and self._open
            self._unplanned &= not planned
            self._open &= not answered
        if planned or answered:
            self._arrivals._done(planned, answered)

    def __enter__(self) -> "Arrival":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
