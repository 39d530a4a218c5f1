"""How the engine loop answers failures: which error a request is told,
and, for failures outside a step, when a streak of them means telling the
waiting requests too or ending the loop.

Does not: touch the context or the requests (the loop does, as told here).
"""

from __future__ import annotations

from ..errors import EngineError, GenerationFailed

# Turns in a row that fail outside a step (or whose recovery fails) before the loop gives up: its
# requests are told and new ones refused. Chosen: a fault that repeats at once is not passing.
LOOP_FAILURES = 3


def told_error(exc: BaseException) -> EngineError:
    """The error a request is told when ``exc`` ended it: an engine error as
    it is, anything else as a :class:`GenerationFailed` naming it."""
    return exc if isinstance(exc, EngineError) else GenerationFailed(f"the engine failed ({exc!r})")


class FailureStreak:
    """Failures in a row outside a step. After each, the next turn first
    recovers (every request held is told); the ``limit``-th in a row also
    tells those waiting (one of them may be the cause); one more is the
    loop itself failing, and :meth:`failed` raises it."""

    def __init__(self, limit: int = LOOP_FAILURES) -> None:
        self.limit = limit
        self.count = 0
        self.last: Exception | None = None

    def failed(self, exc: Exception) -> None:
        """Count ``exc``; re-raise it past the limit."""
        self.count, self.last = self.count + 1, exc
        if self.count > self.limit:
            raise exc

    def passed(self) -> None:
        """A turn ran: the streak is over."""
        self.count, self.last = 0, None

    @property
    def recovering(self) -> bool:
        """Whether the next turn must recover first."""
        return self.count > 0

    @property
    def tell_waiting(self) -> bool:
        """Whether the recovery also tells the waiting requests."""
        return self.count == self.limit
