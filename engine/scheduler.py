"""Who the engine works for next: pure decisions, no model.

Each step of the engine's loop evaluates one batch: one token for every
sequence that is generating (decode is bandwidth-bound, so the step costs
little more than one of them), then as many prompt tokens of sequences
still prefilling as the step's budget allows (prefill is compute-bound, so
it is spent where a deadline needs it). Prompts are served earliest
deadline first; requests without a deadline after those with one, in
arrival order; background work (a summary, a prefix prefilled ahead) last,
and only while no request with a deadline has prompt tokens waiting.

A request's wait under the current load is estimated from the same rules:
the prompt tokens that go before it, the decode steps interleaved with
them, and a slot to free when none is.

Does not: touch llama.cpp, measure time, or plan prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

FOREGROUND, BACKGROUND = 0, 1


@dataclass(frozen=True)
class Work:
    """What the scheduler sees of one request: its key, deadline (seconds
    on the engine's clock; ``math.inf`` for none), arrival, prompt tokens
    still to evaluate, answer tokens still to generate, and whether it is
    generating now or is background work."""

    key: int
    deadline: float
    arrival: float
    to_prefill: int
    to_decode: int = 0
    generating: bool = False
    background: bool = False

    def priority(self) -> tuple[int, float, float]:
        """Sort key: foreground first, then earliest deadline, then arrival."""
        return (BACKGROUND if self.background else FOREGROUND, self.deadline, self.arrival)


@dataclass(frozen=True)
class Step:
    """One batch: the requests that decode a token, and the prompt tokens
    each prefilling request evaluates, in priority order."""

    decode: tuple[int, ...]
    prefill: tuple[tuple[int, int], ...]

    @property
    def tokens(self) -> int:
        """Tokens in the batch."""
        return len(self.decode) + sum(n for _, n in self.prefill)


def plan_step(active: Sequence[Work], *, busy_budget: int, idle_budget: int, n_batch: int) -> Step:
    """The next batch for the ``active`` requests (those holding a sequence).

    Prompt tokens get ``busy_budget`` while others decode (so their streams
    keep moving), ``idle_budget`` otherwise; the batch never exceeds
    ``n_batch``. Background prompts only get what no foreground prompt wants.

    With one request decoding and two prefilling (deadlines 5 and 3), a
    budget of 4 and prompts of 3 tokens each:
    ``plan_step(...) -> Step(decode=(1,), prefill=((3, 3), (2, 1)))``
    """
    decode = tuple(w.key for w in active if w.generating)
    budget = min(busy_budget if decode else idle_budget, n_batch - len(decode))
    waiting = sorted((w for w in active if w.to_prefill > 0 and not w.generating), key=Work.priority)
    foreground_waiting = any(not w.background for w in waiting)
    prefill: list[tuple[int, int]] = []
    for w in waiting:
        if budget <= 0 or (w.background and foreground_waiting):
            break
        n = min(w.to_prefill, budget)
        prefill.append((w.key, n))
        budget -= n
    return Step(decode, tuple(prefill))


def admission_order(waiting: Sequence[Work]) -> list[Work]:
    """Requests waiting for a sequence, in the order they get one; background
    work only when no foreground request waits."""
    ordered = sorted(waiting, key=Work.priority)
    if any(not w.background for w in ordered):
        ordered = [w for w in ordered if not w.background]
    return ordered


@dataclass(frozen=True)
class Load:
    """The engine's load as a new request with some deadline would meet it:
    prompt tokens that go before it, sequences generating, the prompt tokens
    a step takes while others decode, the seconds of a decode step at this
    batch size (measured), whether a sequence is free, and if not, the
    fewest answer tokens left to any generating request."""

    ahead_tokens: int
    generating: int
    busy_budget: int
    decode_step_s: float
    free_slot: bool = True
    slot_after_tokens: int = 0


def load_for(active: Sequence[Work], waiting: Sequence[Work], deadline: float, *, busy_budget: int,
             decode_step_s: float, free_slots: int) -> Load:
    """The load a foreground request with ``deadline`` meets: everything
    foreground with an earlier deadline goes before it."""
    ahead = sum(w.to_prefill for w in (*active, *waiting) if not w.background and w.deadline <= deadline)
    generating = [w for w in active if w.generating]
    free = free_slots > len([w for w in waiting if not w.background])
    soonest = min((w.to_decode for w in generating), default=0)
    return Load(ahead, len(generating), busy_budget, decode_step_s, free, 0 if free else soonest)


def expected_wait(load: Load, cost: Callable[[int, int], float]) -> float:
    """Seconds before a new request's own prompt starts being evaluated:
    the prompts ahead of it (``cost(n_new, n_cached)`` seconds for their
    tokens), the decode steps interleaved with them, and the decode steps
    until a sequence frees when none is free."""
    steps = math.ceil(load.ahead_tokens / max(load.busy_budget, 1)) if load.generating else 0
    slot = load.slot_after_tokens * load.decode_step_s if not load.free_slot else 0.0
    return cost(load.ahead_tokens, 0) + steps * load.decode_step_s + slot


def slowdown(load: Load, seconds_per_token: float) -> float:
    """How much slower a new request's own prefill runs for the decode steps
    of the others interleaved with it: 1 when nothing else is generating.

    ``slowdown(Load(0, 4, 64, 0.032), 0.005) -> 1.1``
    """
    if not load.generating or seconds_per_token <= 0:
        return 1.0
    return 1.0 + load.decode_step_s / (max(load.busy_budget, 1) * seconds_per_token)
