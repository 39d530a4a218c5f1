"""A request rate limit per caller: a token bucket each.

Does not: decide who a caller is (the service does: its API key, else its address).
"""

from __future__ import annotations

import threading
import time

MAX_BUCKETS = 10_000  # callers remembered before idle ones are dropped


class RateLimiter:
    """A token bucket per caller: ``per_minute`` requests a minute, in bursts
    of up to a tenth of that (at least 5). Buckets of callers idle long
    enough to be full again are dropped, so memory stays bounded however
    many callers come and go. Thread safe."""

    def __init__(self, per_minute: int, max_buckets: int = MAX_BUCKETS) -> None:
        self.rate = per_minute / 60.0
        self.burst = max(per_minute / 10.0, 5.0)
        self.max_buckets = max_buckets
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)

    def take(self, caller: str) -> float:
        """0 if ``caller`` may go now, else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) >= self.max_buckets and caller not in self._buckets:
                self._prune(now)
            tokens, then = self._buckets.get(caller, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens >= 1:
                self._buckets[caller] = (tokens - 1, now)
                return 0.0
            self._buckets[caller] = (tokens, now)
            return (1 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        # A bucket that would be full by now is the same as no bucket.
        refill_s = self.burst / self.rate
        self._buckets = {c: (t, then) for c, (t, then) in self._buckets.items() if now - then < refill_s}
        if len(self._buckets) >= self.max_buckets:  # all active: the longest idle half goes
            newest = sorted(self._buckets.items(), key=lambda item: item[1][1])[-(self.max_buckets // 2):]
            self._buckets = dict(newest)
