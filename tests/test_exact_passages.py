"""Lossless passage KV reuse on the real model (the default): the segments
of an answered prompt are kept where they lie, and a later prompt that
begins with the same tokens up to a passage's end takes them as they are
(engine.llama_cpp.passage_kv, engine.llama_cpp.splicing); the planner puts
the passages it holds first (rag.qa.planner), and the pipeline counts them.
The pure parts (prefer_stored, held_first, segments) are tested here too."""

from __future__ import annotations

import numpy as np
import pytest

from engine.llama_cpp.passage_kv import segments
from engine.llama_cpp.requests import Trace
from engine.llama_cpp.snapshots import SnapshotCache
from prompt_budget import Candidate, ContextPassage, build_messages, system_message
from prompt_budget.budgeter import prefer_stored
from prompt_budget.layout import passage_body
from rag.conversations.memory import stable_prefix
from rag.qa.planner import held_first
from tests.conftest import prepared_pipeline

PASSAGES = [
    ContextPassage("notes/cat.md", "The cat named Tom sleeps on the red mat every afternoon, after lunch. " * 3),
    ContextPassage("notes/paris.md", "Paris is the capital of France, and the Seine flows through it. " * 3),
    ContextPassage("notes/safe.md", "The launch code is 4471. It is kept in the blue safe in the cellar. " * 3),
    ContextPassage("notes/tea.md", "Green tea is steeped for two minutes in water at eighty degrees. " * 3),
]
QUESTION = "What is the launch code?"


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """An engine of its own with the default settings (exact reuse on) and its system prompt cached."""
    from engine.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(n_ctx=1024, slots=2, snapshot_dir=tmp_path_factory.mktemp("kv"))
    b.prefill(stable_prefix(b, [system_message()]), session="system", pin=True)
    yield b
    b.close()


@pytest.fixture
def store(exact, tmp_path):
    """A fresh, empty store for one test."""
    exact.passages.start_over(SnapshotCache(1 << 30, tmp_path / "passages", 1 << 30))
    exact.passages.exact = True
    return exact.passages


def bodies(passages):
    return [passage_body(p) for p in passages]


def answer(b, passages, question=QUESTION, max_tokens=16):
    b.forget_prompts()  # nothing held by an idle sequence: only the store can supply passages
    prompt = b.tokenize(b.render(build_messages(question, passages)))
    predicted, inside = b.held_prefix(prompt, bodies(passages))
    text, timings = b.generate(prompt, max_tokens=max_tokens, passages=bodies(passages)).result()
    assert timings.cached_tokens + timings.prefill_tokens == timings.prompt_tokens
    return text, timings, predicted, inside


def test_exact_reuse_is_on_by_default(exact):
    from rag.settings import Settings

    assert Settings().engine.exact_passages is True
    assert exact.exact_passages and exact.splice_fresh is None


def forced_logits(b, passages, forced, *, cached_by_prefix: int = 0):
    """The logits of ``forced`` as the answer to the prompt of ``passages``,
    from the system prompt alone or, with ``cached_by_prefix``, with that
    many prompt tokens left cached by an idle sequence (llama.cpp's prefix cache)."""
    b.forget_prompts()
    prompt = b.tokenize(b.render(build_messages(QUESTION, passages)))
    if cached_by_prefix:
        b.generate(prompt[:cached_by_prefix], max_tokens=1).result()
    trace = Trace(forced=tuple(forced))
    _, timings = b.generate(prompt, max_tokens=len(forced), trace=trace, passages=bodies(passages)).result()
    return np.asarray(trace.logits), timings


def test_a_prompt_that_begins_as_an_answered_one_takes_its_passages_exactly(exact, store):
    cold_text, cold, _, _ = answer(exact, PASSAGES)
    assert cold.spliced_tokens == 0
    warm_text, warm, predicted, inside = answer(exact, PASSAGES)
    # Every passage is followed by more prompt, so each made a segment, and all four are taken.
    assert warm.spliced_passages == 4 and inside == 4
    assert warm.spliced_tokens > 0.8 * (warm.prompt_tokens - len(exact.loop.system))
    assert predicted == warm.cached_tokens  # the planner's figure is what the engine found
    # Lossless: bit for bit what llama.cpp's own prefix cache gives when it holds the same tokens.
    # (A prompt evaluated in two parts is not bit for bit one evaluated at once, reuse or not:
    # README, "Passage KV reuse"; rag bench reuse judges the answers.)
    forced = exact.tokenize(warm_text)[:6]
    reused, t = forced_logits(exact, PASSAGES, forced)
    assert t.spliced_passages == 4
    store.exact = False
    by_prefix, t = forced_logits(exact, PASSAGES, forced, cached_by_prefix=warm.cached_tokens)
    assert t.cached_tokens == warm.cached_tokens and t.spliced_tokens == 0
    assert np.array_equal(reused, by_prefix)


def test_only_passages_behind_the_same_tokens_are_taken(exact, store):
    answer(exact, PASSAGES[:3])
    # The same first passage, then another: its segment is held, the next ones are not (they
    # followed other tokens), so they are evaluated.
    _, t, predicted, inside = answer(exact, [PASSAGES[0], PASSAGES[3], PASSAGES[2]])
    assert t.spliced_passages == 1 and inside == 1 and predicted == t.cached_tokens
    # The same passages in another order share no segment at all.
    _, t, _, inside = answer(exact, [PASSAGES[2], PASSAGES[0], PASSAGES[1]])
    assert t.spliced_passages == 0 and inside == 0


def test_a_changed_passage_is_never_served_from_its_old_kv(exact, store):
    answer(exact, PASSAGES[:3])
    changed = ContextPassage(PASSAGES[1].source, PASSAGES[1].text.replace("Seine", "Loire"))
    _, t, _, inside = answer(exact, [PASSAGES[0], changed, PASSAGES[2]])
    assert t.spliced_passages == 1 and inside == 1  # the first only: what follows the change is not the same


def test_with_exact_reuse_off_nothing_is_kept(exact, store):
    store.exact = False
    answer(exact, PASSAGES)
    store.exact = True
    _, t, _, inside = answer(exact, PASSAGES)
    assert t.spliced_tokens == 0 and inside == 0


def test_the_second_ask_of_a_question_takes_its_passages_held_and_says_so(tmp_path, embedder, exact, store):
    backend = exact  # an engine of its own: no other test's conversations or snapshots in it
    p = prepared_pipeline(tmp_path, embedder, backend)
    try:
        first = p.ask("What does prefill fill, and what limits decode?", target_ttft=None, max_tokens=8)
        backend.forget_prompts()  # idle sequences forget: the store alone holds the passages
        second = p.ask("What does prefill fill, and what limits decode?", target_ttft=None, max_tokens=8)
    finally:
        p.close()
    assert first.timings.spliced_tokens == 0 and first.budget.chosen >= 2
    assert second.timings.spliced_passages == second.budget.chosen
    assert [s.chunk_id for s in second.sources] == [s.chunk_id for s in first.sources]
    assert all(d.spliced for d in second.budget.decisions if d.chosen)
    assert not any(d.spliced for d in first.budget.decisions)


def test_segments_run_from_passage_end_to_passage_end():
    assert segments(range(10), [(3, 5), (6, 8)], 2) == [(2, 5), (5, 8)]
    assert segments(range(10), [(3, 5), (6, 10)], 2) == [(2, 5)]  # a passage that ends the prompt makes none
    assert segments(range(10), [(1, 2), (3, 5)], 2) == [(2, 5)]  # one inside the cached system prompt adds none


def test_a_held_candidate_goes_ahead_of_near_equal_ones_only():
    cands = [Candidate(10, 0.90), Candidate(10, 0.88, spliced=10), Candidate(10, 0.50), Candidate(10, 0.40, spliced=10)]
    assert prefer_stored([0, 1, 2, 3], cands, 0.05) == [1, 0, 2, 3]
    assert prefer_stored([0, 1, 2, 3], cands, 0.0) == [0, 1, 2, 3]
    assert prefer_stored([0, 1, 2, 3], cands, 0.5) == [1, 3, 0, 2]


def test_the_held_path_goes_first_as_far_as_it_was_picked():
    assert held_first([0, 1, 2], [7, 5, 9], [9, 7, 4, 5]) == [2, 0, 1]
    assert held_first([1, 0], [7, 5], [3, 7]) == [1, 0]  # its first not picked: nothing goes ahead


def test_bench_reuse_pairs_each_mode_with_the_full_prefill_and_counts_passes(run, corpus, tmp_path):
    import json

    from engine.models import default_model_path

    questions = tmp_path / "gold.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in (
        {"question": "What does prefill fill?", "gold": ["prefill.md"], "facts": [["kv", "cache"]]},
        {"question": "What limits decode?", "gold": ["decode.txt"], "facts": [["bandwidth", "memory"]]})))
    # --model: an engine of its own, not the shared one, whose KV cells are laid out by every test before
    # this one (with flash attention the order of a sequence's cells is the order its attention is summed in).
    out = run("bench", "reuse", "--corpus", corpus, "--include", "*", "--index", tmp_path / "index",
              "--questions", questions, "--fresh", "0", "--target-ttft", "5", "--max-tokens", "12",
              "--model", default_model_path(), "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    fidelity = {row["mode"]: row for row in result["summary"]["fidelity"]}
    assert set(fidelity) == {"full", "exact", "prefix cache", "R=0"}
    # Lossless: answer for answer what llama.cpp's prefix cache gives when it holds as many tokens.
    assert fidelity["exact"]["identical_to_prefix_cache"] == 1.0
    assert fidelity["full"]["spliced_tokens"] == 0 and fidelity["exact"]["spliced_tokens"] > 0
    for row in result["summary"]["fidelity"]:
        assert row["right"] - row["only_it_right"] + row["only_full_right"] == fidelity["full"]["right"]
    passes = {(row["reuse"], row["pass"]): row for row in result["summary"]["passes"]}
    assert passes[("off", 2)]["spliced_tokens"] == 0 and passes[("on", 2)]["spliced_tokens"] > 0


def test_the_forms_recent_prompts_showed_are_remembered_and_bounded():
    from rag.qa.planner import ShownForms

    forms = ShownForms(size=2)
    window = ContextPassage("a.md", "a window")
    forms.note([("c1", window), ("c2", ContextPassage("b.md", "b"))])
    assert forms.get("c1") == window
    forms.note([("c3", ContextPassage("c.md", "c"))])
    assert forms.get("c2") is None and forms.get("c3") is not None  # c1 was used last, so c2 went first
    assert forms.get("c1") == window


def test_a_held_passage_after_one_left_out_is_not_counted_as_held():
    from prompt_budget import BudgetRequest
    from rag.qa.planner import held_budget

    # Path [0, 1]: passage 1 is held only behind passage 0, which is below the relevance floor.
    cands = [Candidate(100, 0.1, spliced=100, splice_s=0.0), Candidate(100, 0.9, spliced=100, splice_s=0.0),
             Candidate(100, 0.8)]
    request = BudgetRequest(fixed_tokens=50, n_ctx=2048, reserve_tokens=64, target_ttft=1.0,
                            relevance_floor=0.5, min_k=0)
    plan, used = held_budget(cands, [0, 1], request, lambda new, cached: new * 0.006)
    assert 0 not in plan.chosen and used[1].spliced == 0  # evaluated: what it costs is counted
    assert plan.chosen == (1,)  # 100 evaluated tokens fit the target, a second 100 do not
    plan, used = held_budget(cands, [1, 0], request, lambda new, cached: new * 0.006)
    assert used[1].spliced == 100  # first in the path: held whatever follows
