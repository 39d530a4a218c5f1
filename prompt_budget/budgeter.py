"""Choosing which retrieved passages go into the prompt.

Given ranked candidates with their token counts, the fixed part of the
prompt, a TTFT target and a prefill cost model, the budgeter picks the
passages so that the predicted time to first token meets the target, and
the prompt plus the reserved answer tokens never exceed the context window,
whatever the target.

The rules, in order:

* a candidate below the relevance floor, or overlapping a better-ranked
  candidate of the same source (adjacent splits share their overlap), is
  dropped whatever the budget;
* the first ``min_k`` remaining candidates are taken even over the target
  (trimmed to it where they can be), so an answer always has context;
* then candidates are taken in relevance order while they fit whole; the
  first one that does not fit is trimmed into what remains, at a sentence
  boundary, when at least ``min_trim_tokens`` remain; otherwise it is skipped
  for the first later candidate that fits whole.

The last rule takes at most one chunk past the first that did not fit, so a
larger target never chooses fewer chunks.

Does not: count tokens, trim text (see ``trim``) or measure time (callers
pass a cost function fitted on measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence


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
    tokens, its relevance, and where it comes from (for overlap)."""

    tokens: int
    score: float
    source: str = ""
    start: int = 0
    end: int = 0


@dataclass(frozen=True)
class BudgetRequest:
    """Everything but the candidates that a budget decision depends on.

    ``fixed_tokens`` counts every prompt token that is not a passage (system
    prompt, history, question, template); the first ``cached_tokens`` of the
    prompt are expected to be in the engine's KV cache already.
    ``overhead_s`` is time spent or expected outside prefill (retrieval,
    tokenising, the first decode step).
    """

    fixed_tokens: int
    n_ctx: int
    reserve_tokens: int
    target_ttft_s: float | None = None
    cached_tokens: int = 0
    overhead_s: float = 0.0
    safety: float = 1.0
    min_k: int = 1
    max_k: int = 8
    relevance_floor: float = float("-inf")
    min_trim_tokens: int = 32


@dataclass(frozen=True)
class Decision:
    """What happened to one candidate: ``tokens`` is what it adds to the
    prompt (less than its size when trimmed), ``ttft_s`` the predicted TTFT
    of the prompt with it and every candidate chosen before it."""

    index: int
    chosen: bool
    reason: str | None  # why it was dropped: ttft, context, relevance, near-duplicate, max_k
    tokens: int
    ttft_s: float
    trimmed: bool = False


@dataclass(frozen=True)
class Plan:
    """The chosen candidates (indices, in relevance order), the dropped ones
    with their reasons, and the predictions for the resulting prompt.

    ``predicted_ttft_s`` is the cost model's central prediction;
    ``planned_ttft_s`` the one inflated by the safety factor that the target
    was held against. ``trim`` maps a chosen index to the tokens it may keep.
    """

    chosen: tuple[int, ...]
    dropped: tuple[tuple[int, str], ...]
    prompt_tokens: int
    predicted_ttft_s: float
    planned_ttft_s: float
    feasible: bool
    trim: dict[int, int] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()


CostFn = Callable[[int, int], float]  # (n_new, n_cached) -> prefill seconds


def _overlaps(a: Candidate, b: Candidate) -> bool:
    return a.source == b.source and a.source != "" and a.start < b.end and b.start < a.end


def passage_room(request: BudgetRequest, cost: CostFn) -> int:
    """Most passage tokens that keep the planned TTFT of ``request`` (its
    fixed tokens, cache and overhead) on target and the prompt inside the
    context window; 0 when not even the fixed tokens meet the target."""
    return _room(request, cost, request.fixed_tokens)


def _room(r: BudgetRequest, cost: CostFn, used: int) -> int:
    ctx_limit = r.n_ctx - r.reserve_tokens
    if r.target_ttft_s is None:
        return max(ctx_limit - used, 0)
    cached = min(r.cached_tokens, r.fixed_tokens)

    def planned(total: int) -> float:
        return r.overhead_s + r.safety * cost(max(total - cached, 0), cached)

    lo, hi = 0, max(ctx_limit - used, 0)
    if planned(used) > r.target_ttft_s:
        return 0
    while lo < hi:  # prefill cost grows with tokens: bisect
        mid = (lo + hi + 1) // 2
        if planned(used + mid) <= r.target_ttft_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_budget(candidates: Sequence[Candidate], request: BudgetRequest, cost: CostFn) -> Plan:
    """Choose passages from ``candidates`` (best first) under ``request``.

    ``cost(n_new, n_cached)`` predicts prefill seconds. Raises
    ContextTooSmall if the fixed tokens and the answer reserve alone exceed
    the context window.
    """
    r = request
    ctx_limit = r.n_ctx - r.reserve_tokens
    if r.fixed_tokens > ctx_limit:
        raise ContextTooSmall(r.fixed_tokens, r.reserve_tokens, r.n_ctx)
    cached = min(r.cached_tokens, r.fixed_tokens)

    def central(total: int) -> float:
        return r.overhead_s + cost(max(total - cached, 0), cached)

    def planned(total: int) -> float:
        return r.overhead_s + r.safety * cost(max(total - cached, 0), cached)

    def ttft_room(used: int) -> int:
        return _room(r, cost, used)

    decisions: dict[int, Decision] = {}
    eligible: list[int] = []
    for i, c in enumerate(candidates):
        if c.score < r.relevance_floor:
            decisions[i] = Decision(i, False, "relevance", 0, 0.0)
        elif any(_overlaps(c, candidates[j]) for j in eligible):
            decisions[i] = Decision(i, False, "near-duplicate", 0, 0.0)
        elif c.tokens <= 0:
            decisions[i] = Decision(i, False, "context", 0, 0.0)
        else:
            eligible.append(i)

    used = r.fixed_tokens
    chosen: list[int] = []
    trim: dict[int, int] = {}

    def take(i: int, tokens: int) -> None:
        nonlocal used
        used += tokens
        chosen.append(i)
        if tokens < candidates[i].tokens:
            trim[i] = tokens
        decisions[i] = Decision(i, True, None, tokens, central(used), tokens < candidates[i].tokens)

    def drop(i: int, reason: str) -> None:
        decisions[i] = Decision(i, False, reason, 0, central(used + candidates[i].tokens))

    queue = list(eligible)
    full = False
    # The first min_k: taken even over the target, trimmed towards it.
    while queue and len(chosen) < min(r.min_k, r.max_k) and not full:
        i = queue.pop(0)
        size = candidates[i].tokens
        room_ctx = ctx_limit - used
        if room_ctx < min(size, r.min_trim_tokens):
            drop(i, "context")
            continue
        room = min(room_ctx, max(ttft_room(used), r.min_trim_tokens))
        if size <= room:
            take(i, size)
        else:
            take(i, room)
            full = True
    # Then: whole while they fit; trim the first that does not, or skip it
    # for the first later one that fits whole.
    skipped_once = False
    while queue and not full:
        i = queue.pop(0)
        if len(chosen) >= r.max_k:
            drop(i, "max_k")
            continue
        size = candidates[i].tokens
        room_ctx = ctx_limit - used
        room_ttft = ttft_room(used)
        room = min(room_ctx, room_ttft)
        if size <= room:
            take(i, size)
            if skipped_once:
                full = True
            continue
        reason = "context" if room_ctx < size and room_ctx <= room_ttft else "ttft"
        if skipped_once:
            drop(i, reason)
        elif room >= r.min_trim_tokens:
            take(i, room)
            full = True
        else:
            drop(i, reason)
            skipped_once = True
    for i in queue:  # left once the budget is full
        if len(chosen) >= r.max_k:
            drop(i, "max_k")
        else:
            drop(i, "context" if ctx_limit - used < candidates[i].tokens else "ttft")

    feasible = r.target_ttft_s is None or planned(used) <= r.target_ttft_s
    ordered = tuple(decisions[i] for i in range(len(candidates)))
    return Plan(
        chosen=tuple(chosen),
        dropped=tuple((d.index, d.reason) for d in ordered if not d.chosen),
        prompt_tokens=used,
        predicted_ttft_s=central(used),
        planned_ttft_s=planned(used),
        feasible=feasible,
        trim=trim,
        decisions=ordered,
    )


def fit_to_context(
    candidates: Sequence[Candidate],
    *,
    fixed_tokens: int,
    n_ctx: int,
    reserve_tokens: int,
    max_k: int,
) -> Plan:
    """The budget with no TTFT target: only the context window limits.

    ``fit_to_context([Candidate(50, .9), Candidate(90, .8), Candidate(20, .7)],
    fixed_tokens=30, n_ctx=128, reserve_tokens=16, max_k=3)`` chooses
    ``(0, 2)`` and drops ``(1, "context")``.
    """
    request = BudgetRequest(
        fixed_tokens=fixed_tokens, n_ctx=n_ctx, reserve_tokens=reserve_tokens,
        max_k=max_k, min_k=0, min_trim_tokens=10**9,
    )
    return plan_budget(candidates, request, lambda n_new, n_cached: 0.0)
