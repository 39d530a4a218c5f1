"""The pinned system prompt's life cycle in the engine's loop: held in
sequence 0, being rebuilt, or lost after a failure and loaded again at
later turns, further apart each time, until it is back.

Pure bookkeeping: the loop loads the snapshot and tells this what sequence
0 holds; this says what to report and when the next load is due.
"""

from __future__ import annotations

import logging
from typing import Sequence

log = logging.getLogger("rag_budget.engine")
# Quick loads of the pinned system prompt after a failure lost it, at the next turns (the loop does not
# wait for work meanwhile). Chosen: a fault that passes at once (a busy disk, cells freed by the failure).
SYSTEM_TRIES = 3
# After those, a load is tried again at later turns with work, 1, 2, 4, ... turns apart and at most this
# many (a turn is one step, or one pass that found none): never given up while one is pinned, never
# in a tight loop. Chosen, counted in turns so that it means the same on a CPU and a GPU.
SYSTEM_RETRY_TURNS = 64


class SystemPrompt:
    """What sequence 0 holds as the shared system prompt, and, once a
    failure lost a pinned one, how many loads failed and when the next is due."""

    def __init__(self) -> None:
        self.tokens: list[int] = []  # the tokens sequence 0 holds
        self.retries = 0  # failed loads of the pinned system prompt since it was lost (0: not lost)
        self.quick_tries = 0  # quick loads left (the loop does not wait for work while any are)
        self._due: int | None = None  # the turn from which its next load is tried (None: none to try)

    def state(self) -> str:
        """As reports show it: ``held, N tokens``, ``lost, N failed loads``
        (prompts are evaluated without it, and no passage is warmed or
        spliced, until a later load brings it back), or ``none`` (none
        pinned, or it is being rebuilt)."""
        if self.tokens:
            return f"held, {len(self.tokens)} tokens"
        if self.retries:
            return f"lost, {self.retries} failed load{'s' if self.retries != 1 else ''}; tried again at later steps"
        return "none"

    def due(self, turn: int) -> bool:
        """Whether a load of the lost system prompt is due at ``turn``."""
        return self._due is not None and turn >= self._due

    def rebuilding(self) -> None:
        """Sequence 0 is being rebuilt by a request: it holds nothing shared meanwhile."""
        self.tokens = []

    def held(self, tokens: Sequence[int], *, pinned: bool, turn: int) -> None:
        """Sequence 0 now holds ``tokens``. Held empty while one is
        ``pinned``, it is lost: said once, then due again ``SYSTEM_TRIES``
        times at the next turns and after that at later turns, further
        apart each time (up to ``SYSTEM_RETRY_TURNS``), until it is back."""
        self.tokens = [int(t) for t in tokens]
        if self.tokens or not pinned:
            if self.retries:
                log.warning("the shared system prompt is held again, after %d failed loads", self.retries)
            self.retries, self.quick_tries, self._due = 0, 0, None
            return
        if not self.retries:
            log.warning("the shared system prompt could not be loaded again: prompts are evaluated without it, "
                        "and no passage is warmed or spliced, until it loads (tried again at later steps)")
            self.quick_tries = SYSTEM_TRIES
        self.retries += 1
        self.quick_tries = max(self.quick_tries - 1, 0)
        later = min(2 ** max(self.retries - SYSTEM_TRIES, 0), SYSTEM_RETRY_TURNS)
        self._due = turn + (0 if self.quick_tries else later)
