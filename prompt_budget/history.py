"""When to fold old conversation turns into the summary, and how many.

Recent turns are replayed as they were prompted, so their KV stays cached
from one turn to the next and costs nothing to prefill again; but they take
context window, and the prompt keeps growing. When the recent turns exceed
``recent_tokens``, the oldest are folded into the summary until what stays
is at most ``keep_tokens``.

The trade-off the budget sets: rewriting the summary changes the prompt
right after the system prompt, so everything after it (the kept turns) must
be prefilled again once. Folding a little every turn would pay that every
turn; folding in steps (from ``recent_tokens`` down to ``keep_tokens``, half
of it by default) pays it once per step, and the step is done after an
answer, off the critical path, where the new prefix is prefilled before the
next question arrives. A larger ``recent_tokens`` means fewer rewrites but
a larger cached context, whose attention term the budgeter charges to every
later prompt.

Does not: summarise (the pipeline asks the model) or count tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class HistoryPolicy:
    """Token budgets of the recent turns: fold above ``recent_tokens``,
    down to ``keep_tokens``; a summary has at most ``summary_tokens``."""

    recent_tokens: int = 1536
    keep_tokens: int = 768
    summary_tokens: int = 160

    def __post_init__(self) -> None:
        if not 0 <= self.keep_tokens <= self.recent_tokens:
            raise ValueError(f"need 0 <= keep_tokens <= recent_tokens, not {self.keep_tokens} and {self.recent_tokens}")
        if self.summary_tokens < 16:
            raise ValueError(f"summary_tokens must be at least 16, not {self.summary_tokens}")

    @classmethod
    def for_context(cls, n_ctx: int) -> "HistoryPolicy":
        """The default budgets for a context window of ``n_ctx`` tokens:
        recent turns up to three eighths of it, folded down to half that."""
        recent = max(n_ctx * 3 // 8, 64)
        return cls(recent_tokens=recent, keep_tokens=recent // 2, summary_tokens=max(min(160, n_ctx // 16), 16))


def turns_to_fold(turn_tokens: Sequence[int], policy: HistoryPolicy) -> int:
    """How many of the oldest turns (tokens per turn, oldest first) to fold
    into the summary now: none while they fit ``recent_tokens``, else the
    fewest that bring the rest to ``keep_tokens`` or under.

    ``turns_to_fold([500, 500, 500, 500], HistoryPolicy(1536, 768)) -> 3``
    """
    total = sum(turn_tokens)
    if total <= policy.recent_tokens:
        return 0
    folded = 0
    for tokens in turn_tokens:
        if total <= policy.keep_tokens:
            break
        total -= tokens
        folded += 1
    return folded


def turns_to_skip(turn_tokens: Sequence[int], room: int) -> int:
    """How many of the oldest turns to leave out of a prompt so the newest
    ones fit in ``room`` tokens (for when folding has not caught up).

    ``turns_to_skip([300, 200, 100], 350) -> 1``
    """
    total, skip = sum(turn_tokens), 0
    for tokens in turn_tokens:
        if total <= room:
            break
        total -= tokens
        skip += 1
    return skip
