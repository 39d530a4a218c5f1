"""The engine's scheduling decisions and the load-aware plan: pure logic,
with the deterministic fake backend where a backend is needed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine import FakeBackend
from engine.scheduler import (Load, MixedStep, Wait, Work, admission_order, expected_wait, plan_step, prefill_seconds, slowdown,
                              step_beside)
from engine.llama_cpp.slots import SlotTable
from prompt_budget import PrefillCostModel
from prompt_budget.cost import PrefillSample, fit_samples
from rag.errors import Overloaded
from rag.index.store import Hit
from rag.qa.options import AskOptions
from rag.qa.planner import LATE_GRACE, LoadPlan, PromptPlanner


def work(key, deadline=math.inf, arrival=0.0, to_prefill=0, to_decode=8, generating=False, background=False,
         pieces=0):
    return Work(key, deadline, arrival, to_prefill, to_decode, generating, background, pieces)


def test_every_generating_request_decodes_and_prompts_go_earliest_deadline_first():
    active = [work(1, generating=True), work(2, deadline=3.1, to_prefill=3), work(3, deadline=3.0, to_prefill=3),
              work(4, generating=True)]
    step = plan_step(active, busy_step_tokens=4, idle_step_tokens=512, n_batch=512)
    assert step.decode == (1, 4) and step.prefill == ((3, 3), (2, 1)) and step.tokens == 6


def test_a_step_that_ends_a_prompt_takes_no_prompt_due_much_later():
    # All of a step's first tokens come at its end: a later prompt's tokens there would delay them.
    from engine.scheduler import SHARED_END_S

    ending, later = work(1, deadline=3.0, to_prefill=20), work(2, deadline=3.0 + 4 * SHARED_END_S, to_prefill=200)
    assert plan_step([ending, later], busy_step_tokens=256, idle_step_tokens=256, n_batch=512).prefill == ((1, 20),)
    # Due about as soon (a burst), they share it.
    near = replace(later, deadline=3.0 + SHARED_END_S / 2)
    assert plan_step([ending, near], busy_step_tokens=256, idle_step_tokens=256, n_batch=512).prefill == ((1, 20), (2, 200))
    # A new request behind it waits for its own step, and the plan says so.
    alone = expected_wait(Load((ending,), (), slots=4, idle_step_tokens=256), 9.0, lambda n, c, o=0: 0.004 * n)
    assert alone.seconds == pytest.approx(0.08)


def test_an_idle_engine_takes_whole_prompts_and_never_more_than_a_batch():
    step = plan_step([work(1, to_prefill=900)], busy_step_tokens=64, idle_step_tokens=512, n_batch=512)
    assert step.prefill == ((1, 512),)
    crowded = [work(i, generating=True) for i in range(500)] + [work(999, to_prefill=100)]
    assert plan_step(crowded, busy_step_tokens=64, idle_step_tokens=512, n_batch=512).tokens == 512


def test_a_summary_being_written_pauses_while_a_question_is_prefilled():
    summary = work(9, generating=True, background=True)
    question = work(1, deadline=2.0, to_prefill=300)
    step = plan_step([summary, question], busy_step_tokens=64, idle_step_tokens=512, n_batch=512)
    assert step.decode == () and step.prefill == ((1, 300),)  # the whole prompt in one step, not 64 at a time
    answering = work(2, generating=True)
    step = plan_step([summary, answering, question], busy_step_tokens=64, idle_step_tokens=512, n_batch=512)
    assert step.decode == (2,) and step.prefill == ((1, 64),)  # a foreground stream keeps moving
    assert plan_step([summary, answering], busy_step_tokens=64, idle_step_tokens=512, n_batch=512).decode == (9, 2)


def test_background_work_gives_way_to_any_request_with_a_prompt_waiting():
    fold = work(9, to_prefill=50, background=True)
    assert plan_step([fold, work(1, deadline=2.0, to_prefill=10)], busy_step_tokens=64, idle_step_tokens=64,
                     n_batch=512).prefill == ((1, 10),)
    assert plan_step([fold], busy_step_tokens=64, idle_step_tokens=64, n_batch=512).prefill == ((9, 50),)
    waiting = [work(1, background=True), work(2, deadline=9.0), work(3, deadline=1.0)]
    assert [w.key for w in admission_order(waiting)] == [3, 2]


def test_the_wait_a_request_meets_runs_the_scheduler_forward():
    def cost(n, cached, others=0):
        return 0.005 * n

    def Load64(*args, **kwargs):  # the figures below were worked out for steps of 64 prompt tokens beside decodes
        return Load(*args, busy_step_tokens=64, **kwargs)

    active = (work(1, generating=True, to_decode=5), work(2, deadline=1.0, to_prefill=100),
              work(3, deadline=9.0, to_prefill=300), work(4, to_prefill=50, background=True))
    measured = ((1, 0.03),)
    assert expected_wait(Load64(), 5.0, cost) == Wait(0.0, 0)
    # A free sequence: only the earlier deadline's prompt goes first, in two steps (the step that ends
    # it takes no prompt due much later), then ours beside two answers.
    roomy = Load64(active, (), slots=6, decode_steps=measured)
    assert expected_wait(roomy, 5.0, cost) == Wait(pytest.approx(0.35 + 36 * 0.005 + 0.03), 2)
    # On an idle engine one step takes several prompts due about as soon: those ahead in it count.
    burst = Load64((), (work(7, deadline=4.9, to_prefill=200),), slots=6)
    assert expected_wait(burst, 5.0, cost) == Wait(pytest.approx(1.0), 0)
    # None free: request 1 must finish its five tokens first, while 2 and 3 prefill beside it (2's
    # last 36 tokens in a step of their own).
    full = Load64(active, (), slots=4, decode_steps=measured)
    assert expected_wait(full, 5.0, cost) == Wait(pytest.approx(0.35 + 0.21 + 3 * 0.38), 1)
    # The background prefill never delays it; one waiting with an earlier deadline does.
    ahead = Load64(active, (work(5, deadline=2.0, to_prefill=64),), slots=6, decode_steps=measured)
    assert expected_wait(ahead, 5.0, cost).seconds > expected_wait(roomy, 5.0, cost).seconds
    assert expected_wait(Load64(slots=0), 5.0, cost).seconds == math.inf
    assert slowdown(Load64(decode_steps=((4, 0.032),)), Wait(0.0, 4), cost) == pytest.approx(1.1)
    assert slowdown(Load64(), Wait(0.0, 0), cost) == 1.0
    # Under a new prefill decode those generating now, or every foreground request ahead if more.
    ahead = (work(1, generating=True), work(2, to_prefill=9), work(3, to_prefill=9, background=True))
    assert step_beside(Load64(ahead, (), decode_steps=((2, 0.04),)), Wait(0.0, 1), cost) == 0.04
    assert step_beside(Load64(), Wait(0.0, 0), cost) == 0.0
    assert Load64().decode_s(3, 0.005) == pytest.approx(0.015) and Load64(decode_steps=measured).decode_s(2, 1) == 0.06


def test_a_background_step_already_running_is_waited_for_it_cannot_be_interrupted():
    from engine.scheduler import BACKGROUND_STEP_TOKENS, Step, StepStats

    def cost(n, cached, others=0):
        return 0.004 * n

    # A summary's prompt of 445 tokens on an idle engine: background work gets at most
    # BACKGROUND_STEP_TOKENS a step, so a question arriving meanwhile waits for that much at most.
    summary = work(4, to_prefill=445, to_decode=160, background=True)
    step = plan_step([summary], busy_step_tokens=256, idle_step_tokens=512, n_batch=512)
    assert step.prefill == ((4, BACKGROUND_STEP_TOKENS),)
    assert plan_step([summary], busy_step_tokens=256, idle_step_tokens=512, n_batch=512, background_step_tokens=512).prefill == ((4, 445),)
    # The step is known as it runs (warming, which the load leaves out, alike): a new question waits
    # for what is left of it, then goes ahead of the rest of the background prompt.
    stats = StepStats()
    assert stats.in_flight(10.0) == (None, 0.0)
    stats.begin(step, 10.0)
    running, ran = stats.in_flight(10.2)
    assert running == step and ran == pytest.approx(0.2)
    load = Load((summary,), (), slots=6, in_flight=running, in_flight_s=ran)
    assert expected_wait(load, 5.0, cost) == Wait(pytest.approx(cost(BACKGROUND_STEP_TOKENS, 0) - 0.2), 0)
    warming = Step((), ((9, 100),))  # key 9 holds no published sequence: warming the passage store
    assert expected_wait(Load((), (), slots=6, in_flight=warming, in_flight_s=0.1), 5.0, cost) == \
        Wait(pytest.approx(0.3), 0)
    stats.count(0, [(BACKGROUND_STEP_TOKENS, 0)], 0.5)
    assert stats.in_flight(10.6) == (None, 0.0)


def test_a_step_of_requests_already_running_is_waited_for_even_by_one_due_sooner():
    from engine.scheduler import Step, StepStats

    def cost(n, cached, others=0):
        return 0.004 * n

    stats = StepStats()
    running = Step((), ((1, 300),))
    stats.begin(running, 20.0)
    assert stats.in_flight(20.2) == (running, pytest.approx(0.2))
    # Request 1 (due at 5 s) is 0.2 s into its 300-token step; a new request due at 3 s comes first
    # by deadline but still waits for the 1.0 s of that step that is left, and nothing more.
    before = (work(1, deadline=5.0, to_prefill=300),)
    load = Load(before, (), slots=4, in_flight=running, in_flight_s=0.2)
    assert expected_wait(load, 3.0, cost).seconds == pytest.approx(1.0)
    assert expected_wait(Load(before, (), slots=4), 3.0, cost).seconds == 0.0  # as it was planned before
    stats.count(0, [(300, 0)], 1.2)
    assert stats.in_flight(21.3) == (None, 0.0)


def test_the_slowdown_beside_decodes_is_measured_from_steps_that_held_both():
    from engine.scheduler import Step, StepStats

    def cost(n, cached, others=0):
        return 0.004 * n

    stats = StepStats()
    for seconds in (1.4, 1.5, 1.6):  # 256 prompt tokens (1.024 s alone) beside 6 decodes
        stats.begin(Step((6,), ((1, 256),)), 0.0)
        stats.count(6, [(256, 0)], seconds)
    stats.count(6, [], 0.05)  # a decode-only step is not one of them
    assert stats.mixed_steps() == tuple(MixedStep(((256, 0),), 6, 0, s) for s in (1.4, 1.5, 1.6))
    measured = Load(busy_step_tokens=256, decode_steps=((6, 0.05),), mixed_steps=stats.mixed_steps())
    assert slowdown(measured, Wait(0.0, 6), cost) == pytest.approx(1.5 / 1.024)
    assert slowdown(measured, Wait(0.0, 7), cost) == pytest.approx(1.5 / 1.024)  # about as many decodes
    # Beside 2 decodes nothing was measured: a prompt step plus a decode-only step, as before.
    assert slowdown(measured, Wait(0.0, 2), cost) == pytest.approx(1 + 0.05 / 1.024)


def test_steps_ahead_beside_decodes_are_waited_for_as_long_as_such_steps_measured():
    # Measured in rag bench serve (8 clients, 2026-12-04): a step of 256 prompt tokens beside 7
    # answers took 1.0-1.5 times its prefill plus a decode step, as the answers' caches grew. A new
    # request waiting behind two such steps was told 1.5 s and waited 2.1 s.
    def cost(n, cached, others=0):
        return 0.004 * n

    def load(mixed):
        # Two prompts of 256 tokens ahead, each a step of its own beside six long answers.
        active = (*(work(k, generating=True, to_decode=30) for k in range(6)),
                  work(6, deadline=1.0, to_prefill=256, to_decode=30), work(7, deadline=1.5, to_prefill=256, to_decode=30))
        return Load(active, (), slots=9, busy_step_tokens=256, decode_steps=((6, 0.05), (7, 0.05)), mixed_steps=mixed)

    plain = expected_wait(load(()), 5.0, cost).seconds
    assert plain == pytest.approx(2 * (1.024 + 0.05))  # nothing measured: prefill plus a decode step, as before
    slow = tuple(MixedStep(((256, 0),), d, 0, s) for d, s in ((6, 1.6), (6, 1.5), (7, 1.7)))
    assert expected_wait(load(slow), 5.0, cost).seconds == pytest.approx(1.6 + 1.6)  # each step as measured
    fast = (MixedStep(((256, 0),), 6, 0, 1.03),) * 3  # measured cheaper than the sum: never planned below it
    assert expected_wait(load(fast), 5.0, cost).seconds == pytest.approx(plain)


def test_steps_ahead_are_costed_at_each_prompts_context_and_beside_the_cells_held():
    # Measured in rag bench serve (8 clients): 256 prompt tokens at context 74, beside 1,300 cells
    # of other sequences, took 1.14 s; costed at context 0 with no others, 0.82 s.
    def cost(n, cached, others=0):
        return 0.004 * n + 2e-6 * n * (cached + n / 2) + 1e-6 * n * others

    def load(context, cells, mixed=()):
        ahead = work(1, deadline=1.0, to_prefill=256, to_decode=30)
        return Load((replace(ahead, context=context),), (), slots=4, busy_step_tokens=256, idle_step_tokens=256, cells=cells,
                    mixed_steps=mixed)

    assert expected_wait(load(0, 0), 5.0, cost).seconds == pytest.approx(cost(256, 0))
    assert expected_wait(load(1000, 3000), 5.0, cost).seconds == pytest.approx(cost(256, 1000, 2000))
    # A step measured deep in a context and beside many cells gives the ratio to what the cost model
    # predicts for it there, so the same ratio holds for a prompt at the start of its context.
    deep = prefill_seconds([(256, 1000)], 3000, cost)
    mixed = (MixedStep(((256, 1000),), 6, 3000, 1.2 * deep),) * 3
    assert slowdown(load(0, 0, mixed), Wait(0.0, 6), cost) == pytest.approx(1.2)


def test_a_prompt_with_stored_passages_ahead_takes_a_step_for_each():
    def cost(n, cached, others=0):
        return 0.01 + 0.005 * n

    def load(pieces):
        # No free sequence: the new request waits until request 2 has its one answer token.
        return Load((work(1, generating=True, to_decode=50), work(2, deadline=1.0, to_prefill=40, to_decode=1,
                                                                  pieces=pieces)), (), slots=2, decode_steps=((1, 0.03),))

    # Evaluated whole, its 40 tokens take one step; with 8 stored passages to splice in, nine.
    assert expected_wait(load(0), 5.0, cost).seconds == pytest.approx(cost(40, 0) + 0.03)
    assert expected_wait(load(8), 5.0, cost).seconds == pytest.approx(8 * (cost(5, 0) + 0.03) + cost(0, 0) + 0.03)


def test_idle_sequences_are_a_cache_given_up_least_recently_used_first():
    table = SlotTable(3)
    a, _ = table.take()
    b, _ = table.take()
    table.release(a, [1, 2, 3, 4])
    table.release(b, [1, 2, 9])
    assert table.best([1, 2, 3, 7]) == (a, 3)
    seq, held = table.take()  # the empty one goes first
    assert held == 0 and seq not in (a, b)
    assert table.evict(2) == [a] and table.idle_cells() == 3


def _cost() -> PrefillCostModel:
    samples = [PrefillSample(0, n, 0.01 + 0.005 * n) for n in (16, 64, 256, 1024)]
    return PrefillCostModel(fit_samples(samples, "linear"), anchors=samples)


def _hits(n: int) -> list[Hit]:
    return [Hit(f"c{i}", f"d{i}.md", 1 - i / 100, " ".join(f"w{i}x{j}" for j in range(40)) + ".", None,
                i * 1000, i * 1000 + 400, 0) for i in range(n)]


def test_under_load_a_plan_takes_fewer_passages_and_says_how_many_fewer():
    planner = PromptPlanner(FakeBackend(n_ctx=4096))
    kwargs = dict(target_ttft=2.0, cost=_cost(), elapsed=lambda: 0.0)
    idle = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), **kwargs)
    busy = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(1.0, 1.2), **kwargs)
    assert busy.budget.chosen < idle.budget.chosen
    assert busy.budget.cut_for_load == idle.budget.chosen - busy.budget.chosen > 0
    assert busy.budget.load_wait_s == 1.0 and idle.budget.cut_for_load == 0
    # Seven questions arrived before it and are planned after it: it leaves them room, and its
    # own prediction is not charged with their time.
    burst = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(behind=7), **kwargs)
    assert burst.budget.chosen < idle.budget.chosen and burst.budget.cut_for_load > 0
    assert burst.budget.predicted_ttft_s <= idle.budget.predicted_ttft_s


def test_a_plan_counts_the_cells_other_sequences_hold():
    # A cost model that has learned what others' cells cost each prompt token: with 6,000 cells held
    # by other conversations the same question takes fewer passages, and predicts them truly.
    samples = [PrefillSample(0, n, 0.01 + 0.005 * n + 1e-6 * n * others, others)
               for n in (16, 64, 256, 1024) for others in (0, 3000, 6000)]
    cost = PrefillCostModel(fit_samples(samples, "occupancy"), anchors=samples)
    planner = PromptPlanner(FakeBackend(n_ctx=4096))
    kwargs = dict(target_ttft=2.0, cost=cost, elapsed=lambda: 0.0)
    empty = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), **kwargs)
    full = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(cells=6000), **kwargs)
    assert full.budget.chosen < empty.budget.chosen
    assert LoadPlan(cells=6000).others(70) == 5930 and LoadPlan().others(70) == 0


class _StoringFake(FakeBackend):
    """Holds every passage stored: for the planner's arithmetic, not the engine's."""

    splice_fresh = 0

    def stored_passages(self, texts):
        return [len(self.tokenize(t)) for t in texts]

    def keep_passages(self, texts):
        return 0

    def precompute_passages(self, texts, progress=None):
        return {}


def test_under_load_each_stored_passage_costs_a_step_of_the_busy_engine():
    # Every stored passage spliced in ends an evaluation step, and a step of a busy engine also
    # decodes the others: cheap when idle, a whole such step each under load.
    planner = PromptPlanner(_StoringFake(n_ctx=4096))
    kwargs = dict(target_ttft=1.0, cost=_cost(), elapsed=lambda: 0.0)
    idle = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), **kwargs)
    assert idle.budget.chosen == 8 and all(d.spliced for d in idle.budget.decisions if d.chosen)
    busy = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(step_s=0.2), **kwargs)
    assert 0 < busy.budget.chosen < idle.budget.chosen and busy.budget.planned_ttft_s <= 1.0


def test_only_a_question_that_cannot_make_its_target_even_alone_is_refused():
    planner = PromptPlanner(FakeBackend(n_ctx=4096))
    kwargs = dict(target_ttft=2.0, cost=_cost(), elapsed=lambda: 0.0)
    late = AskOptions.of(refuse_late=True)
    with pytest.raises(Overloaded) as refused:
        planner.plan("What is prefill?", _hits(8), late, load=LoadPlan(2.5), **kwargs)
    assert refused.value.retry_after_s > 0.5
    squeezed = planner.plan("What is prefill?", _hits(8), late, load=LoadPlan(1.2), **kwargs)
    # Answered on time, with no passage rather than a late one.
    assert squeezed.budget.chosen == 0 and squeezed.budget.predicted_ttft_s <= 2.0 and squeezed.budget.feasible
    served = planner.plan("What is prefill?", _hits(8), AskOptions.of(), load=LoadPlan(2.5), **kwargs)
    assert served.budget.chosen >= 1  # without refuse_late it is answered late
    # A little late (within LATE_GRACE of the target) is answered, without passages, not refused:
    # a refused client would wait its Retry-After and then a whole first token again.
    nearly = planner.plan("What is prefill?", _hits(8), late, load=LoadPlan(1.6), **kwargs)
    assert nearly.budget.chosen == 0 and 2.0 < nearly.budget.predicted_ttft_s <= 2.0 * (1 + LATE_GRACE)


def test_questions_expected_before_its_first_token_are_left_room_for():
    # At 8 clients a question planned when nothing waited took four passages (500 prompt tokens);
    # the five asked a moment later started 2.4 s after they asked.
    planner = PromptPlanner(FakeBackend(n_ctx=4096))
    kwargs = dict(target_ttft=2.0, cost=_cost(), elapsed=lambda: 0.0)
    alone = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(), **kwargs)
    expecting = planner.plan("What is prefill?", _hits(8), AskOptions.of(max_k=8), load=LoadPlan(coming=3.0), **kwargs)
    assert expecting.budget.chosen < alone.budget.chosen and expecting.budget.coming == 3.0


def test_a_question_planned_later_does_not_go_ahead_of_one_planned_before_it():
    from rag.qa.dispatch import ORDER_SLACK_S, Dispatcher

    dispatcher = Dispatcher(None, None, lambda: None)
    assert dispatcher._in_plan_order(10.0) == 10.0
    # Received 50 ms earlier but planned after: served after the plan that already counted on going first.
    assert dispatcher._in_plan_order(9.95) == 10.0
    # Due sooner by more than a retrieval's jitter (a tighter target): still first.
    assert dispatcher._in_plan_order(10.0 - 2 * ORDER_SLACK_S) == 10.0 - 2 * ORDER_SLACK_S
    assert dispatcher._in_plan_order(None) is None  # no target, no deadline
    assert dispatcher._in_plan_order(10.1) == 10.1


def test_the_busy_step_budget_has_one_default_everywhere():
    """The engine, its loop and the load a planner reads agree on the prompt
    tokens a busy step takes (they were 256, 64 and 64)."""
    import inspect

    from engine.llama_cpp.loop import EngineLoop
    from engine.scheduler import BUSY_STEP_TOKENS
    from engine.settings import EngineSettings

    assert Load().busy_step_tokens == BUSY_STEP_TOKENS
    assert inspect.signature(EngineLoop).parameters["busy_step_tokens"].default == BUSY_STEP_TOKENS
    assert EngineSettings().busy_step_tokens == BUSY_STEP_TOKENS  # the in-process engine's (LlamaCppBackend)


def test_step_budgets_follow_the_measured_prompt_rate():
    """A step takes as many prompt tokens as fit its seconds at the rate its
    engine measured: a GPU's whole batch, never fewer than the CPU's tokens."""
    from engine.scheduler import BUSY_STEP_S, StepStats

    assert StepStats().step_tokens(BUSY_STEP_S, 256, 512) == 256  # nothing measured yet
    fast = StepStats()
    fast.count(4, [(500, 0)], 0.05)  # 10,000 prompt tokens a second
    assert fast.step_tokens(BUSY_STEP_S, 256, 512) == 512
    slow = StepStats()
    slow.count(2, [(256, 0)], 1.7)  # half this CPU's rate
    assert slow.step_tokens(BUSY_STEP_S, 256, 512) == 256
    few = StepStats()
    few.count(1, [(8, 0)], 0.001)  # too few tokens to tell the rate from the step's fixed cost
    assert few.step_tokens(BUSY_STEP_S, 256, 512) == 256
    between = StepStats()
    between.count(3, [(300, 0)], 0.5)  # 600 tokens a second beside three answers
    assert between.step_tokens(BUSY_STEP_S, 256, 512) == int(BUSY_STEP_S * 600)
    alone = StepStats()
    alone.count(0, [(500, 0)], 0.05)  # a prompt-only step runs faster than the steps the budget is for
    assert alone.step_tokens(BUSY_STEP_S, 256, 512) == 256
