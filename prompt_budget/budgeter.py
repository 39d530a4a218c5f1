"""Choosing which retrieved passages go into the prompt.

For now this enforces the hard limit only: the prompt plus the tokens
reserved for the answer never exceed the context window. Candidates are
taken in relevance order; one too long to fit is dropped, and shorter ones
after it may still be taken.

Does not: predict time (see ``cost``) or measure tokens (callers pass counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


class ContextTooSmall(ValueError):
    """The fixed parts of the prompt and the answer reserve alone exceed the window."""

    def __init__(self, fixed_tokens: int, reserve_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"{fixed_tokens} prompt tokens + {reserve_tokens} answer tokens exceed the context window of {n_ctx}"
        )
        self.fixed_tokens = fixed_tokens
        self.reserve_tokens = reserve_tokens
        self.n_ctx = n_ctx


@dataclass(frozen=True)
class Candidate:
    """A retrieved passage as the budgeter sees it: its cost in prompt
    tokens and its relevance score."""

    tokens: int
    score: float


@dataclass(frozen=True)
class Plan:
    """The chosen candidates (indices into the input, in input order), the
    dropped ones with the reason, and the prompt's predicted token count."""

    chosen: tuple[int, ...]
    dropped: tuple[tuple[int, str], ...]
    prompt_tokens: int


def fit_to_context(
    candidates: Sequence[Candidate],
    *,
    fixed_tokens: int,
    n_ctx: int,
    reserve_tokens: int,
    max_k: int,
) -> Plan:
    """Take candidates in order while the prompt still fits
    ``n_ctx - reserve_tokens``, at most ``max_k`` of them.

    ``fit_to_context([Candidate(50, .9), Candidate(90, .8), Candidate(20, .7)],
    fixed_tokens=30, n_ctx=128, reserve_tokens=16, max_k=3)`` chooses
    ``(0, 2)`` and drops ``(1, "context")``.

    Raises ContextTooSmall if the fixed tokens and the reserve alone exceed
    ``n_ctx``.
    """
    limit = n_ctx - reserve_tokens
    if fixed_tokens > limit:
        raise ContextTooSmall(fixed_tokens, reserve_tokens, n_ctx)
    used = fixed_tokens
    chosen: list[int] = []
    dropped: list[tuple[int, str]] = []
    for i, c in enumerate(candidates):
        if len(chosen) >= max_k:
            dropped.append((i, "max_k"))
        elif used + c.tokens > limit:
            dropped.append((i, "context"))
        else:
            chosen.append(i)
            used += c.tokens
    return Plan(tuple(chosen), tuple(dropped), used)
