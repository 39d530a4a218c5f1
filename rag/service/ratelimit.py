"""Limits per caller: what a caller holds at once (questions in flight,
uploads in flight and the bytes they carry), and a generous request rate
against floods, a token bucket each.

A team behind one address (a NAT, a proxy, one front-end) is one caller:
it may ask as many questions as the engine can take, as long as it does not
hold more than its share at once (issue 37).

Does not: decide who a caller is (the service does: its API key, else its
address) or which limit a request falls under (the gate does).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

MAX_BUCKETS = 10_000  # callers remembered before idle ones are dropped
BURST_SHARE = 10  # a bucket holds a tenth of a minute's requests (at least MIN_BURST)
MIN_BURST = 5


class RateLimiter:
    """A token bucket per caller: ``per_minute`` requests a minute, in bursts
    of up to a tenth of that (at least 5). Buckets of callers idle long
    enough to be full again are dropped, so memory stays bounded however
    many callers come and go. Thread safe."""

    def __init__(self, per_minute: int, max_buckets: int = MAX_BUCKETS) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.burst = max(per_minute / BURST_SHARE, float(MIN_BURST))
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


class InFlight:
    """What each caller holds at once of one kind of request: at most
    ``most`` requests (0: no limit) and, when ``most_bytes`` is set, at most
    that many bytes among them; a caller holding nothing may always send
    one. Only callers holding something are remembered. Thread safe."""

    def __init__(self, most: int, most_bytes: int = 0) -> None:
        self.most, self.most_bytes = most, most_bytes
        self._held: dict[str, tuple[int, int]] = {}  # caller -> (requests, bytes)
        self._lock = threading.Lock()

    def held(self, caller: str) -> int:
        """How many requests ``caller`` has in flight now."""
        with self._lock:
            return self._held.get(caller, (0, 0))[0]

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def enter(self, caller: str, size: int = 0) -> str | None:
        """Take a place for ``caller``'s request of ``size`` bytes: None if
        taken (give it back with :meth:`leave`), else which limit it would
        pass: ``"requests"`` or ``"bytes"``."""
        with self._lock:
            count, carried = self._held.get(caller, (0, 0))
            if count and self.most and count >= self.most:
                return "requests"
            if count and self.most_bytes and carried + size > self.most_bytes:
                return "bytes"
            self._held[caller] = (count + 1, carried + size)
            return None

    def leave(self, caller: str, size: int = 0) -> None:
        """Give back a place :meth:`enter` took."""
        with self._lock:
            count, carried = self._held.get(caller, (1, size))
            if count <= 1:
                self._held.pop(caller, None)
            else:
                self._held[caller] = (count - 1, carried - size)


@dataclass
class CallerLimits:
    """The service's limits per caller: questions and uploads in flight,
    the flood rate (a bucket per caller and kind of request, so uploads do
    not spend the questions' and the other way round), and wrong API keys
    per address."""

    questions: InFlight
    uploads: InFlight
    flood: RateLimiter
    auth_failures: RateLimiter

    @classmethod
    def of(cls, settings) -> "CallerLimits":
        """The limits a :class:`ServiceSettings` asks for."""
        return cls(InFlight(settings.questions_in_flight),
                   InFlight(settings.uploads_in_flight, settings.upload_bytes_in_flight),
                   RateLimiter(settings.rate_limit_per_minute), RateLimiter(settings.auth_failures_per_minute))
