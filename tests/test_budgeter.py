"""The TTFT budgeter: properties that must hold for any input (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prompt_budget.budgeter import BudgetRequest, Candidate, ContextTooSmall, plan_budget


# Properties, not speed: no per-example deadline (hypothesis's default is 200 ms, which a busy or slow
# machine can pass) and no health check on how fast examples are made.
PROPERTIES = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cost(n_new: int, n_cached: int) -> float:
    """A fake prefill cost: 5 ms per token plus an attention term."""
    return 0.01 + 0.005 * n_new + 1e-7 * n_new * (n_cached + n_new / 2)


candidates_st = st.lists(
    st.tuples(st.integers(1, 400), st.floats(0.0, 1.0), st.sampled_from(["a", "b", "c"]), st.integers(0, 5000)),
    max_size=20,
).map(lambda rows: [Candidate(t, s, src, start, start + t * 4) for t, s, src, start in sorted(rows, key=lambda r: -r[1])])

request_st = st.builds(
    BudgetRequest,
    fixed_tokens=st.integers(10, 600),
    n_ctx=st.integers(512, 4096),
    reserve_tokens=st.integers(1, 512),
    target_ttft=st.floats(0.05, 6.0),
    cached_tokens=st.integers(0, 600),
    overhead_s=st.floats(0.0, 0.1),
    safety=st.floats(1.0, 1.3),
    min_k=st.integers(0, 3),
    max_k=st.integers(1, 10),
    relevance_floor=st.floats(0.0, 0.3),
)


def _plan(candidates, request):
    try:
        return plan_budget(candidates, request, cost)
    except ContextTooSmall:
        assert request.fixed_tokens + request.reserve_tokens > request.n_ctx
        return None


@settings(PROPERTIES, max_examples=300)
@given(candidates_st, request_st)
def test_never_over_the_context_window(candidates, request):
    plan = _plan(candidates, request)
    if plan is None:
        return
    assert plan.prompt_tokens + request.reserve_tokens <= request.n_ctx
    assert plan.prompt_tokens == request.fixed_tokens + sum(plan.trim.get(i, candidates[i].tokens) for i in plan.chosen)
    assert len(plan.chosen) <= request.max_k
    assert sorted(plan.chosen + tuple(i for i, _ in plan.dropped)) == list(range(len(candidates)))
    assert all(reason in {"ttft", "context", "relevance", "near-duplicate", "max_k"} for _, reason in plan.dropped)


@settings(PROPERTIES, max_examples=300)
@given(candidates_st, request_st)
def test_target_holds_unless_only_min_k_chunks_were_taken(candidates, request):
    plan = _plan(candidates, request)
    if plan is None:
        return
    if len(plan.chosen) > request.min_k:
        assert plan.planned_ttft_s <= request.target_ttft + 1e-9
    assert plan.predicted_ttft_s <= plan.planned_ttft_s + 1e-12
    assert plan.feasible == (plan.planned_ttft_s <= request.target_ttft)


@settings(PROPERTIES, max_examples=300)
@given(candidates_st, request_st, st.floats(0.0, 5.0))
def test_a_larger_target_never_chooses_fewer_chunks(candidates, request, more):
    small = _plan(candidates, request)
    if small is None:
        return
    large = plan_budget(candidates, BudgetRequest(**{**request.__dict__, "target_ttft": request.target_ttft + more}), cost)
    assert len(large.chosen) >= len(small.chosen)


@settings(PROPERTIES, max_examples=200)
@given(candidates_st, request_st, st.integers(0, 600))
def test_cached_tokens_never_make_a_prompt_cost_more(candidates, request, extra_cached):
    cold = _plan(candidates, BudgetRequest(**{**request.__dict__, "cached_tokens": 0}))
    if cold is None:
        return
    warm = plan_budget(candidates, BudgetRequest(**{**request.__dict__, "cached_tokens": extra_cached}), cost)
    assert len(warm.chosen) >= len(cold.chosen)


def test_reasons_and_the_skip_for_a_shorter_chunk():
    cands = [
        Candidate(100, 0.9, "a.md", 0, 400),
        Candidate(100, 0.85, "a.md", 350, 750),   # overlaps the first: adjacent split
        Candidate(600, 0.8, "b.md", 0, 2400),     # too long for what is left, too little left to trim usefully
        Candidate(20, 0.7, "c.md", 0, 80),        # fits: taken instead
        Candidate(50, 0.01, "d.md", 0, 200),      # below the floor
    ]
    req = BudgetRequest(fixed_tokens=100, n_ctx=4096, reserve_tokens=256, target_ttft=cost(225, 0),
                        min_trim_tokens=32, relevance_floor=0.05, max_k=8)
    plan = plan_budget(cands, req, cost)
    assert plan.chosen == (0, 3)
    assert dict(plan.dropped) == {1: "near-duplicate", 2: "ttft", 4: "relevance"}


def test_the_last_chunk_is_trimmed_to_fill_the_target():
    cands = [Candidate(100, 0.9, "a", 0, 1), Candidate(300, 0.8, "b", 0, 1)]
    req = BudgetRequest(fixed_tokens=50, n_ctx=4096, reserve_tokens=64, target_ttft=cost(300, 0))
    plan = plan_budget(cands, req, cost)
    assert plan.chosen == (0, 1) and plan.trim[1] == 150
    assert plan.planned_ttft_s <= req.target_ttft


def test_the_fixed_part_alone_over_the_window_is_refused():
    try:
        plan_budget([], BudgetRequest(fixed_tokens=4000, n_ctx=4096, reserve_tokens=256), cost)
    except ContextTooSmall as exc:
        assert exc.n_ctx == 4096
    else:
        raise AssertionError("expected ContextTooSmall")
