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
    tokens, its relevance, and where it comes from (for overlap).

    A passage the engine holds stored KV for is not evaluated whole: taken
    whole, ``spliced`` of its tokens are placed from the store in
    ``splice_s`` seconds (the rest, like any passage, is evaluated). Trimmed,
    it is evaluated like any other.
    """

    tokens: int
    score: float
    source: str = ""
    start: int = 0
    end: int = 0
    spliced: int = 0
    splice_s: float = 0.0


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
    target_ttft: float | None = None
    cached_tokens: int = 0
    overhead_s: float = 0.0
    safety: float = 1.0
    min_k: int = 1
    max_k: int = 8
    relevance_floor: float = float("-inf")
    min_trim_tokens: int = 32
    prefer_stored: float = 0.0  # a stored candidate goes ahead of unstored ones at most this much more relevant


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
    spliced: bool = False  # taken whole from the engine's passage store


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


def _room(r: BudgetRequest, cost: CostFn, used: int, spliced: int = 0, splice_s: float = 0.0) -> int:
    """Most further tokens, all evaluated, that keep the plan on target
    and inside the window, with ``used`` tokens in the prompt so far
    (``spliced`` of them placed from the store in ``splice_s``)."""
    ctx_limit = r.n_ctx - r.reserve_tokens
    if r.target_ttft is None:
        return max(ctx_limit - used, 0)
    cached = min(r.cached_tokens, r.fixed_tokens) + spliced

    def planned(total: int) -> float:
        return r.overhead_s + r.safety * (cost(max(total - cached, 0), cached) + splice_s)

    lo, hi = 0, max(ctx_limit - used, 0)
    if planned(used) > r.target_ttft:
        return 0
    while lo < hi:  # prefill cost grows with tokens: bisect
        mid = (lo + hi + 1) // 2
        if planned(used + mid) <= r.target_ttft:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Selection:
    """The passages taken so far and what happened to each candidate."""

    def __init__(self, candidates: Sequence[Candidate], request: BudgetRequest, cost: CostFn) -> None:
        self.candidates, self.r, self.cost = candidates, request, cost
        self.ctx_limit = request.n_ctx - request.reserve_tokens
        self.cached = min(request.cached_tokens, request.fixed_tokens)
        self.used = request.fixed_tokens
        self.spliced, self.splice_s = 0, 0.0  # of the passages taken, placed from the engine's store
        self.chosen: list[int] = []
        self.trim: dict[int, int] = {}
        self.decisions: dict[int, Decision] = {}

    def _seconds(self, total: int, spliced: int, splice_s: float, safety: float) -> float:
        cached = self.cached + spliced
        return self.r.overhead_s + safety * (self.cost(max(total - cached, 0), cached) + splice_s)

    def central(self, total: int) -> float:
        return self._seconds(total, self.spliced, self.splice_s, 1.0)

    def planned(self, total: int) -> float:
        return self._seconds(total, self.spliced, self.splice_s, self.r.safety)

    def room(self) -> int:
        """Evaluated tokens that still fit the target and the window."""
        return _room(self.r, self.cost, self.used, self.spliced, self.splice_s)

    def fits_spliced(self, i: int) -> bool:
        """Whether stored candidate ``i`` fits whole, placed from the store."""
        c = self.candidates[i]
        if not c.spliced or self.used + c.tokens > self.ctx_limit:
            return False
        return self.r.target_ttft is None or self._seconds(
            self.used + c.tokens, self.spliced + c.spliced, self.splice_s + c.splice_s, self.r.safety) <= self.r.target_ttft

    def eligible(self) -> list[int]:
        """Candidates worth considering, in relevance order; the others are
        dropped whatever the budget (irrelevant, overlapping, empty)."""
        eligible: list[int] = []
        for i, c in enumerate(self.candidates):
            if c.score < self.r.relevance_floor:
                self.decisions[i] = Decision(i, False, "relevance", 0, 0.0)
            elif any(_overlaps(c, self.candidates[j]) for j in eligible):
                self.decisions[i] = Decision(i, False, "near-duplicate", 0, 0.0)
            elif c.tokens <= 0:
                self.decisions[i] = Decision(i, False, "context", 0, 0.0)
            else:
                eligible.append(i)
        return eligible

    def take(self, i: int, tokens: int) -> None:
        c = self.candidates[i]
        self.used += tokens
        self.chosen.append(i)
        whole = tokens >= c.tokens
        if not whole:
            self.trim[i] = tokens
        elif c.spliced:
            self.spliced, self.splice_s = self.spliced + c.spliced, self.splice_s + c.splice_s
        self.decisions[i] = Decision(i, True, None, tokens, self.central(self.used), not whole,
                                     spliced=whole and c.spliced > 0)

    def drop(self, i: int, reason: str) -> None:
        self.decisions[i] = Decision(i, False, reason, 0, self.central(self.used + self.candidates[i].tokens))

    def take_first(self, queue: list[int]) -> bool:
        """Take the first ``min_k`` of ``queue`` even over the target,
        trimmed towards it; True once the budget is full."""
        r = self.r
        while queue and len(self.chosen) < min(r.min_k, r.max_k):
            i = queue.pop(0)
            size = self.candidates[i].tokens
            room_ctx = self.ctx_limit - self.used
            if room_ctx < min(size, r.min_trim_tokens):
                self.drop(i, "context")
                continue
            if self.fits_spliced(i):
                self.take(i, size)
                continue
            room = min(room_ctx, max(self.room(), r.min_trim_tokens))
            self.take(i, min(size, room))
            if size > room:
                return True
        return False

    def fill(self, queue: list[int]) -> None:
        """Take candidates whole while they fit; trim the first that does
        not, or skip it for the first later one that fits whole."""
        r = self.r
        skipped_once = False
        while queue:
            i = queue.pop(0)
            if len(self.chosen) >= r.max_k:
                self.drop(i, "max_k")
                continue
            size = self.candidates[i].tokens
            room_ctx = self.ctx_limit - self.used
            room_ttft = self.room()
            room = min(room_ctx, room_ttft)
            if size <= room or self.fits_spliced(i):
                self.take(i, size)
                if skipped_once:
                    return
                continue
            reason = "context" if room_ctx < size and room_ctx <= room_ttft else "ttft"
            if skipped_once:
                self.drop(i, reason)
            elif room >= r.min_trim_tokens:
                self.take(i, room)
                return
            else:
                self.drop(i, reason)
                skipped_once = True

    def leave(self, queue: list[int]) -> None:
        """Drop what is left once the budget is full."""
        for i in queue:
            if len(self.chosen) >= self.r.max_k:
                self.drop(i, "max_k")
            else:
                self.drop(i, "context" if self.ctx_limit - self.used < self.candidates[i].tokens else "ttft")


def prefer_stored(order: Sequence[int], candidates: Sequence[Candidate], margin: float) -> list[int]:
    """``order`` (candidate indices, best first) with each stored candidate
    moved ahead of the unstored ones just before it whose score beats its
    own by at most ``margin``; stored ones keep their order among themselves.

    With scores 0.9, 0.88 (stored), 0.5 and margin 0.05: ``[1, 0, 2]``.
    """
    out: list[int] = []
    for i in order:
        c = candidates[i]
        at = len(out)
        if c.spliced:
            while at > 0 and not candidates[out[at - 1]].spliced and candidates[out[at - 1]].score - c.score <= margin:
                at -= 1
        out.insert(at, i)
    return out


def plan_budget(candidates: Sequence[Candidate], request: BudgetRequest, cost: CostFn) -> Plan:
    """Choose passages from ``candidates`` (best first) under ``request``.

    ``cost(n_new, n_cached)`` predicts prefill seconds. Raises
    ContextTooSmall if the fixed tokens and the answer reserve alone exceed
    the context window.
    """
    r = request
    if r.fixed_tokens > r.n_ctx - r.reserve_tokens:
        raise ContextTooSmall(r.fixed_tokens, r.reserve_tokens, r.n_ctx)
    selection = _Selection(candidates, r, cost)
    queue = prefer_stored(selection.eligible(), candidates, r.prefer_stored)
    if not selection.take_first(queue):
        selection.fill(queue)
    selection.leave(queue)
    used = selection.used
    ordered = tuple(selection.decisions[i] for i in range(len(candidates)))
    return Plan(
        chosen=tuple(selection.chosen),
        dropped=tuple((d.index, d.reason) for d in ordered if not d.chosen),
        prompt_tokens=used,
        predicted_ttft_s=selection.central(used),
        planned_ttft_s=selection.planned(used),
        feasible=r.target_ttft is None or selection.planned(used) <= r.target_ttft,
        trim=selection.trim,
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
