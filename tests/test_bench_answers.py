"""``rag bench answers``: answers scored by their key facts, ours beside
LangChain, with bootstrap intervals; and the bundled gold set checked
against the documentation it is drawn from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag.errors import RagError
from rag.evaluation.grading import GoldQuestion, facts_found, is_right, load_gold, normalise, token_f1
from rag.evaluation.stats import bootstrap_interval, mean

BUNDLED = Path(__file__).resolve().parent.parent / "rag" / "bench" / "data" / "python_docs_answers.jsonl"
DOCS = Path("/usr/share/doc/python3.11/html/_sources")


def test_an_answer_is_right_when_it_states_every_fact():
    q = GoldQuestion("What is the default maxsize of lru_cache?", ("f.rst",), (("128",), (r"lru_cache",)))
    assert is_right("The default `maxsize` of **lru_cache** is 128.", q)
    assert facts_found("It is 256 for lru_cache", q.facts) == [False, True]
    assert not is_right("It caches 1 2 8 items", q)
    assert normalise("Use  `json.LOADS`**!**\n") == "use json.loads!"


def test_token_f1_counts_shared_words():
    assert token_f1("json.loads parses it", "json.loads parses a JSON string") == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert token_f1("", "anything") == 0.0


def test_bootstrap_interval_brackets_the_mean_and_repeats():
    values = [1.0] * 30 + [0.0] * 10
    lo, hi = bootstrap_interval(values, mean)
    assert lo < 0.75 < hi and bootstrap_interval(values, mean) == [lo, hi]
    assert bootstrap_interval([], mean) is None


def test_a_malformed_gold_file_names_its_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "q", "gold": [], "facts": [["ok"]]}\n{"question": "q", "gold": [], "facts": [["(bad"]]}\n')
    with pytest.raises(RagError, match=r"q.jsonl:2"):
        load_gold(path)


def test_the_bundled_facts_are_in_the_docs_and_not_in_the_questions():
    questions = load_gold(BUNDLED)
    assert 30 <= len(questions) <= 40
    for q in questions:
        assert q.reference and is_right(q.reference, q), q.question
        # A fact the question already states would be "found" in an answer that only repeats it.
        assert not any(facts_found(q.question, q.facts)), q.question
    if not DOCS.is_dir():
        pytest.skip("the Python 3.11 documentation is not installed (apt-get install python3.11-doc)")
    for q in questions:
        text = re.sub(r"\s+", " ", " ".join((DOCS / g).read_text(encoding="utf-8") for g in q.gold))
        assert all(any(re.search(a, text, re.IGNORECASE) for a in fact) for fact in q.facts), q.question


def test_bench_answers_scores_ours_beside_langchain(run, corpus, tmp_path):
    pytest.importorskip("langchain_community", reason="the bench extra is not installed")
    questions = tmp_path / "gold.jsonl"
    questions.write_text(json.dumps({"question": "How long should bread dough rise?", "gold": ["guide/cooking.rst"],
                                     "facts": [["two hours|2 hours"]], "reference": "Two hours."}) + "\n")
    result = run("bench", "answers", "--corpus", corpus, "--include", "*", "--questions", questions,
                 "--max-tokens", "4", "--index", tmp_path / "index", "--also-targets", "2.5", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["bench"] == "answers" and d["config"]["target_ttft_s"] == 2.0
    systems = d["summary"]["systems"]
    assert [s["name"] for s in systems] == ["rag-budget", "rag-budget, today's prompt", "rag-budget, 2.5 s",
                                            "rag-budget, no target", "langchain k=4"]
    # Each of ours answers from its own passage store, the turn before forgotten: each finds the
    # system prompt cached and nothing of the passages another's turn just evaluated.
    ours = [r for r in d["rows"] if r["system"].startswith("rag-budget")]
    assert len(ours) == 4 and all(r["chunks"] > 0 for r in ours)
    # The evidence of ours is judged alone (within 60 words), beside whether the prompt states the facts.
    assert all(isinstance(r["evidence_right"], bool) and r["prompt_states_facts"] is True for r in ours)
    assert all(r["evidence_words"] <= 60 or not r["evidence_right"] for r in ours)
    assert ours[0]["cached_tokens"] > 0 and len({r["cached_tokens"] for r in ours}) == 1
    for s in systems:
        assert s["questions"] == 1 and s["accuracy"] in (0.0, 1.0) and len(s["accuracy_ci95"]) == 2
        assert s["median_ttft_s"] > 0 and s["p95_ttft_s"] >= s["median_ttft_s"] and s["invented_citations"] >= 0
    assert {"only_ours_right", "only_theirs_right", "ttft_ratio", "sign_test_p",
            "accuracy_difference_ci95"} <= set(d["summary"]["vs_langchain_k4"])
    assert "vs_todays_prompt" in d["summary"]
    assert len(d["rows"]) == 5 and all(isinstance(r["right"], bool) and "answer" in r for r in d["rows"])
    table = run("bench", "answers", "--corpus", corpus, "--include", "*", "--questions", questions,
                "--max-tokens", "2", "--index", tmp_path / "index", "--no-peer")
    assert table.exit_code == 0, table.output
    assert "accuracy" in table.stdout and "langchain" not in table.stdout
