"""Prompt planning on the deterministic fake backend: pure logic, no model."""

from __future__ import annotations

import pytest

from engine import FakeBackend
from prompt_budget import PastTurn, PrefillCostModel, system_message
from prompt_budget.cost import fit_samples, PrefillSample, PromptShape
from rag.conversations import History
from rag.errors import QuestionTooLong
from rag.index.store import Hit
from rag.qa.options import AskOptions
from rag.qa.planner import PromptPlanner


def _cost(seconds_per_token: float = 0.005) -> PrefillCostModel:
    samples = [PrefillSample(0, n, 0.01 + seconds_per_token * n) for n in (16, 64, 256, 1024)]
    return PrefillCostModel(fit_samples(samples, "linear"), anchors=samples)


def _hits(n: int, words: int = 40) -> list[Hit]:
    return [
        Hit(chunk_id=f"c{i}", source=f"doc{i % 3}.md", score=1.0 - i / 100,
            text=" ".join(f"word{i}x{j}" for j in range(words)) + ".", char_start=i * 1000, char_end=i * 1000 + 500,
            position=i)
        for i in range(n)
    ]


def _plan(backend, hits, *, target=None, history=History(None, (), ()), **options):
    return PromptPlanner(backend).plan("What is prefill?", hits, AskOptions.of(**options), target_ttft=target,
                                       cost=_cost(), elapsed=lambda: 0.0, history=history)


def test_without_a_target_the_context_window_and_max_k_limit_the_prompt():
    backend = FakeBackend(n_ctx=4096)
    plan = _plan(backend, _hits(12), max_k=5, max_tokens=64)
    assert plan.budget.chosen == len(plan.hits) == 5
    assert len(backend.tokenize(plan.text)) + 64 <= backend.n_ctx
    assert [h.chunk_id for h in plan.hits] == sorted((h.chunk_id for h in plan.hits), key=lambda c: (f"doc{int(c[1:]) % 3}.md", int(c[1:])))
    for hit in plan.hits:
        assert hit.text.rstrip(".") in plan.text


def test_a_tighter_target_takes_fewer_passages():
    backend = FakeBackend(n_ctx=4096)
    loose = _plan(backend, _hits(12), target=10.0, max_k=8)
    tight = _plan(backend, _hits(12), target=0.9, max_k=8)
    assert 1 <= tight.budget.chosen < loose.budget.chosen
    assert tight.budget.planned_ttft_s <= 0.9 or tight.budget.chosen == 1
    assert sum(d.reason == "ttft" for d in tight.budget.decisions) >= 1


def test_the_prompt_never_exceeds_the_window_and_a_question_too_long_is_refused():
    backend = FakeBackend(n_ctx=512)
    plan = _plan(backend, _hits(20, words=120), max_k=8, max_tokens=128)
    assert len(backend.tokenize(plan.text)) + 128 <= 512
    with pytest.raises(QuestionTooLong, match="shorten the question"):
        PromptPlanner(backend).plan("why " * 600, _hits(3), AskOptions.of(max_tokens=64), target_ttft=None,
                                    cost=_cost(), elapsed=lambda: 0.0)


def test_history_goes_first_and_old_turns_give_way_to_passages():
    backend = FakeBackend(n_ctx=1024)
    turns = tuple(PastTurn(f"Question {i}? " + "filler " * 80, f"Answer {i}.") for i in range(6))
    tokens = tuple(len(backend.tokenize(t.user + t.answer)) + 10 for t in turns)
    plan = _plan(backend, _hits(4), max_tokens=64, history=History("They talked about prefill.", turns, tokens))
    assert plan.turns_shown < len(turns)  # the oldest were left out of this prompt
    assert plan.text.index("They talked about prefill.") < plan.text.index("Answer 5.") < plan.text.index("What is prefill?")
    assert plan.budget.chosen >= 1


def test_cached_tokens_are_what_the_engine_holds():
    backend = FakeBackend(n_ctx=4096)
    first = _plan(backend, _hits(3), max_k=2)
    assert first.budget.cached_tokens == 0
    backend.generate(first.text, max_tokens=4).result()  # the engine now holds that prompt
    again = _plan(backend, _hits(3), max_k=2)
    system = len(backend.tokenize(backend.render([system_message()])))
    # The prompt before its passages is what can be known cached when planning.
    assert again.budget.cached_tokens >= system - 2 > 0
    # The prediction counts what the engine holds of the whole prompt: here all of it but the last token
    # (measured on the real engine: 74 tokens cached where the prompt before its passages found 66).
    assert again.text == first.text
    assert again.budget.predicted_prefill_s == pytest.approx(_cost().predict(PromptShape(1, len(backend.tokenize(first.text)) - 1)))


def test_the_margin_comes_from_prompts_on_a_like_cached_context():
    backend, cost = FakeBackend(n_ctx=4096), _cost()
    for _ in range(32):  # fresh questions on time; turns on about 1,000 cached tokens 30 % slow
        cost.observe(PrefillSample(0, 300, cost.predict(PromptShape(300, 0))), refit=False)
        cost.observe(PrefillSample(1000, 300, 1.3 * cost.predict(PromptShape(300, 1000))), refit=False)
    planner = PromptPlanner(backend)

    def ask(history: History):
        return planner.plan("What is prefill?", _hits(3), AskOptions.of(), target_ttft=5.0, cost=cost,
                            elapsed=lambda: 0.0, history=history)

    assert ask(History(None, (), ())).budget.safety == 1.0
    turns = tuple(PastTurn(f"Question {i}? " + "filler " * 100, f"Answer {i}.") for i in range(8))
    history = History("They talked about prefill.", turns,
                      tuple(len(backend.tokenize(t.user + t.answer)) + 10 for t in turns))
    backend.generate(ask(history).text, max_tokens=4).result()  # the engine now holds the conversation
    turn = ask(history).budget
    assert 500 <= turn.cached_tokens <= 2000
    assert turn.safety == pytest.approx(1.3 / 1.10)


class _StoringFake(FakeBackend):
    """The fake engine with a passage store holding ``stored`` (passage texts as shown)."""

    splice_fresh = 0

    def __init__(self, stored, **kw) -> None:
        super().__init__(**kw)
        self.stored = set(stored)

    def stored_passages(self, texts):
        return [len(self.tokenize(t)) if t in self.stored else 0 for t in texts]

    def keep_passages(self, texts):
        return 0

    def precompute_passages(self, texts, progress=None):
        return {}


def test_a_passage_stored_whole_stays_whole_under_a_tight_budget_and_is_spliced():
    from prompt_budget import ContextPassage, passage_body

    hits = _hits(6, words=200)
    bare = _plan(_StoringFake(()), hits, target=1.5, max_tokens=16)
    assert bare.budget.chosen >= 1 and not any(h.text in bare.text for h in hits)  # all cut to a window
    whole = passage_body(ContextPassage(hits[0].source, hits[0].text))
    plan = _plan(_StoringFake([whole]), hits, target=1.5, max_tokens=16)
    assert hits[0].text in plan.text and whole in plan.passages
    assert [d.spliced for d in plan.budget.decisions if d.chunk_id == "c0"] == [True]
    assert whole not in plan.to_keep  # stored already
    # Its tokens are predicted as loaded, not evaluated: the prediction is below a full prefill's.
    full = _plan(_StoringFake(()), hits, target=None, max_k=1, max_tokens=16)
    one = _plan(_StoringFake([whole]), hits, target=None, max_k=1, max_tokens=16)
    assert one.text == full.text and one.budget.predicted_ttft_s < full.budget.predicted_ttft_s
