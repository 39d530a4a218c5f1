"""History: when to fold, the conversation store, summaries and their fallback."""

from __future__ import annotations

import sqlite3

import pytest

from engine import FakeBackend
from prompt_budget import HistoryPolicy, turns_to_fold, turns_to_skip
from rag.conversations import ConversationStore, Turn, check_session_id
from rag.errors import RagError
from rag.conversations.summarise import extractive_summary, summarise


def test_nothing_is_folded_within_the_budget():
    assert turns_to_fold([500, 500, 500], HistoryPolicy(1536, 768)) == 0


def test_folding_goes_down_to_the_keep_budget_in_one_step():
    policy = HistoryPolicy(1536, 768)
    assert turns_to_fold([500, 500, 500, 500], policy) == 3
    assert turns_to_fold([100] * 16, policy) == 9  # 700 left
    assert turns_to_fold([2000], policy) == 1


def test_turns_to_skip_leaves_the_newest_that_fit():
    assert turns_to_skip([300, 200, 100], 350) == 1
    assert turns_to_skip([300, 200, 100], 600) == 0
    assert turns_to_skip([300, 200, 100], 50) == 3


def test_policy_for_context_and_validation():
    p = HistoryPolicy.for_context(4096)
    assert p.keep_tokens < p.recent_tokens < 4096
    with pytest.raises(ValueError):
        HistoryPolicy(100, 200)


def turn(n: int, question: str = "q?", answer: str = "An answer. More.") -> Turn:
    return Turn(n, question, f"Context: ...\n\nQuestion: {question}", answer, 20, ({"source": "a.md"},), {"ttft_s": 0.1})


def test_conversations_survive_reopening_and_fold_atomically(tmp_path):
    path = tmp_path / "c.sqlite"
    store = ConversationStore(path)
    for n in (1, 2, 3):
        store.append("s1", turn(n, f"question {n}?"))
    store.close()
    store = ConversationStore(path)  # a new process would see the same
    c = store.load("s1")
    assert [t.number for t in c.turns] == [1, 2, 3] and c.next_number == 4
    assert c.turns[0].sources == ({"source": "a.md"},)
    assert store.fold("s1", through=2, summary="Asked 1 and 2.", expected_version=0,
                      method="llm", tokens=5, seconds=0.5)
    # A second fold from the same starting version loses and changes nothing.
    assert not store.fold("s1", through=3, summary="stale", expected_version=0, method="llm", tokens=1, seconds=0.1)
    c = store.load("s1")
    assert c.summary == "Asked 1 and 2." and c.summary_version == 1
    assert [t.number for t in c.turns] == [3] and c.folded == 2 and c.next_number == 4
    assert store.summaries("s1") == [{"version": 1, "method": "llm", "folded_turns": 2, "tokens": 5, "seconds": 0.5}]
    store.reset("s1")
    assert store.load("s1").turns == ()


def test_a_store_of_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "c.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(RagError, match="schema version 99"):
        ConversationStore(path)


@pytest.mark.parametrize("bad", ["", "a b", "../x", "x" * 200, "-x"])
def test_bad_session_ids_are_refused(bad):
    with pytest.raises(RagError, match="session id"):
        check_session_id(bad)


def count_words(text: str) -> int:
    return len(text.split())


def test_extractive_summary_keeps_the_newest_within_budget():
    turns = [turn(n, f"question number {n}?", f"Answer {n} first. Then more words here.") for n in range(1, 6)]
    text = extractive_summary("Earlier things.", turns, 20, count_words)
    assert count_words(text) <= 20
    assert "question number 5?" in text and "Answer 5 first." in text and "Then more" not in text
    assert "question number 1?" not in text


def test_summarise_falls_back_when_the_model_writes_too_much():
    backend = FakeBackend(reply=" ".join(["word"] * 100))
    text, method = summarise(backend, "", [turn(1, "What is X?", "X is a thing.")], 16)
    assert method == "extractive"
    assert "What is X?" in text and len(backend.tokenize(text)) <= 16


def test_summarise_falls_back_when_the_model_fails():
    class Broken(FakeBackend):
        def generate(self, *args, **kwargs):
            raise RuntimeError("engine crashed")

    text, method = summarise(Broken(), "Before.", [turn(1, "What is Y?", "Y is another.")], 40)
    assert method == "extractive" and text.startswith("Before.")


def test_a_failed_fold_is_logged_and_never_raised_by_a_later_reset(tmp_path):
    # reset() waits for background folds: one that failed earlier must not fail the reset of another session.
    from rag.conversations.memory import ConversationMemory

    class Broken(ConversationStore):
        def fold(self, *args, **kwargs):
            raise sqlite3.OperationalError("disk I/O error")

    store = Broken(tmp_path / "c.sqlite")
    keeper = ConversationMemory(lambda: store, FakeBackend, lambda: HistoryPolicy(recent_tokens=20, keep_tokens=0))
    from engine.backend import Timings

    t = Timings(10, 0, 10, 0.1, 0.1, 2, 0.1, 0.2)
    for n in range(3):
        keeper.remember("s1", f"Question {n}?", f"Question {n}?", "An answer. More words here.", [], t)
    keeper.reset("s2")  # returns: the failure was s1's fold, in the background
    assert any(e.get("error") and e["session"] == "s1" for e in keeper.log), list(keeper.log)
    keeper.close()
