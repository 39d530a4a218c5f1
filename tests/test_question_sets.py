"""The question sets' split and their lines (pure: no model)."""

import json
from pathlib import Path

import pytest

from rag.errors import RagError
from rag.evaluation.grading import GoldQuestion, load_gold
from rag.evaluation.sets import half_of, split, summarise

SETS = Path(__file__).resolve().parent.parent / "rag" / "bench" / "data"  # beside the benches that read them


def _q(i, answerable=True, lang="en"):
    return GoldQuestion(f"q{i}", ("a",) if answerable else (), (("x",),) if answerable else (), "", answerable, lang,
                        str(i))


def test_the_split_is_fixed_disjoint_and_keeps_each_group_in_both_halves():
    qs = [_q(i) for i in range(30)] + [_q(i, False) for i in range(30, 36)] + [_q(i, lang="fr") for i in range(36, 46)]
    tuning, heldout = split(qs)
    assert split(qs) == (tuning, heldout)  # the same every time
    assert {q.id for q in tuning}.isdisjoint({q.id for q in heldout}) and len(tuning) + len(heldout) == len(qs)
    for group in ((True, "en"), (False, "en"), (True, "fr")):
        mine = [q for q in qs if (q.answerable, q.lang) == group]
        assert len([q for q in tuning if q in mine]) == len([q for q in heldout if q in mine]) == len(mine) // 2
    assert half_of(qs, "all") == qs and half_of(qs, "heldout") == heldout
    assert split(qs, seed=1) != (tuning, heldout)


def test_an_unanswerable_line_needs_no_facts_but_an_answerable_one_does(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "x?", "gold": [], "facts": [], "answerable": False}) + "\n")
    assert load_gold(path)[0].answerable is False
    path.write_text(json.dumps({"question": "x?", "gold": [], "facts": []}) + "\n")
    with pytest.raises(RagError, match=":1:"):
        load_gold(path)


@pytest.mark.parametrize("name", ["git_docs.jsonl", "french_docs.jsonl"])
def test_the_bundled_sets_load_with_ids_unique_and_unanswerable_questions(name):
    qs = load_gold(SETS / name)
    assert len({q.id for q in qs}) == len(qs)
    assert any(not q.answerable for q in qs) and all(q.gold for q in qs if q.answerable)


def test_a_decline_that_cost_a_right_answer_is_counted():
    row = {"answerable": True, "best_score": 0.3, "would_decline": True, "chunks_at_2": 2, "gold_at_2": True,
           "evidence_right": False, "prompt_states_facts": True, "declined": True, "right": False,
           "right_if_asked": True, "ttft_s": 0.01, "seen_s": 0.01, "chunks": 0, "prompt_has_gold": False}
    other = dict(row, answerable=False, declined=True, right_if_asked=None, right=None, evidence_right=None,
                 prompt_states_facts=None, gold_at_2=None, prompt_has_gold=None)
    s = summarise([row, other], 2.0, (2.0,), evidence_only=False)
    assert s["declines_that_cost_a_right_answer"] == 1
    assert s["declined_answerable"]["count"] == 1 and s["declined_unanswerable"]["share"] == 1.0
