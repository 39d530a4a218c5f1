"""``rag bench ttft --busy-first-half``: a neighbour for the first half of the
questions, none for the second, and each half reported on its own. Run
through the command over the small corpus, with the pipeline's answers
made up (:class:`Answers`: no model generates anything) and the neighbour
process watched as it is started, spins and is reaped."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from rag.qa.pipeline import Pipeline

QUESTIONS = "".join(f'{{"question": "q{i}?", "gold": ["decode.txt"]}}\n' for i in range(5))


class Neighbours:
    """The CPU-bound neighbours the bench starts (``python -c "while True:
    pass"``), recorded as ``subprocess.Popen`` makes them."""

    def __init__(self, monkeypatch) -> None:
        self.started: list[subprocess.Popen] = []
        real, started = subprocess.Popen, self.started

        class Recorded(real):
            def __init__(self, args, *rest, **kwargs):
                super().__init__(args, *rest, **kwargs)
                if "while True: pass" in list(args):
                    started.append(self)

        monkeypatch.setattr(subprocess, "Popen", Recorded)

    def spinning(self) -> bool:
        return any(child.poll() is None for child in self.started)


class Answers:
    """``Pipeline.ask`` made up: 1.5 s with 3 passages while a neighbour
    spins, 1 s with 6 while none does; ``fail``: an engine gone instead."""

    def __init__(self, neighbours: Neighbours, fail: bool = False) -> None:
        self.neighbours, self.fail, self.busy = neighbours, fail, []

    def __call__(self, question, **options):  # a class attribute of Pipeline, not a method: no self
        if self.fail:
            raise RuntimeError("engine gone")
        busy = self.neighbours.spinning()
        self.busy.append(busy)
        ttft_s, chosen = (1.5, 3) if busy else (1.0, 6)
        timings = SimpleNamespace(ttft_s=ttft_s, prompt_tokens=100, cached_tokens=0, prefill_tokens=100,
                                  prefill_s=ttft_s, spliced_tokens=0)
        budget = SimpleNamespace(predicted_ttft_s=ttft_s, planned_ttft_s=ttft_s, feasible=True, chosen=chosen,
                                 decisions=(), predicted_prefill_s=ttft_s)
        return SimpleNamespace(timings=timings, budget=budget)


@pytest.fixture
def bench(run, corpus, tmp_path, monkeypatch):
    """``rag bench ttft`` over the corpus and five questions, the answers
    made up (``answers(fail=...)`` sets them), nothing calibrated."""
    questions = tmp_path / "q.jsonl"
    questions.write_text(QUESTIONS)
    neighbours = Neighbours(monkeypatch)
    monkeypatch.setattr(Pipeline, "prepare", lambda self: None)  # nothing to calibrate: no answer is generated

    def answers(fail: bool = False) -> Answers:
        made_up = Answers(neighbours, fail)
        monkeypatch.setattr(Pipeline, "ask", made_up)
        return made_up

    def invoke(*args):
        return run("bench", "ttft", "--corpus", corpus, "--questions", questions, "--index", tmp_path / "index",
                   *args)

    return SimpleNamespace(invoke=invoke, answers=answers, neighbours=neighbours)


def test_the_neighbour_runs_for_the_first_half_and_each_half_is_reported(bench):
    answers = bench.answers()
    result = bench.invoke("--targets", "2,4", "--busy-first-half", "--json")
    assert result.exit_code == 0, result.output
    # One neighbour, spinning from before the first question until half of the ten were answered, then reaped.
    (child,) = bench.neighbours.started
    assert answers.busy == [True] * 5 + [False] * 5 and child.returncode is not None
    d = json.loads(result.stdout)
    assert [r["half"] for r in d["rows"]] == ["busy"] * 5 + ["quiet"] * 5
    busy, quiet = d["summary"]["halves"]
    assert (busy["half"], busy["requests"], busy["mean_chunks"]) == ("busy", 5, 3.0)
    assert (quiet["half"], quiet["requests"], quiet["mean_chunks"]) == ("quiet", 5, 6.0)
    assert quiet["p50_ratio"] < busy["p50_ratio"] and quiet["p95_ratio"] <= 0.5
    assert d["config"]["busy_first_half"] is True
    table = bench.invoke("--targets", "2", "--busy-first-half")
    assert table.exit_code == 0, table.output
    assert "neighbour for the first half" in table.stdout and "quiet" in table.stdout


def test_without_the_option_no_neighbour_and_no_halves(bench):
    answers = bench.answers()
    result = bench.invoke("--targets", "2", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert not bench.neighbours.started and answers.busy == [False] * 5
    assert d["config"]["busy_first_half"] is False
    assert "halves" not in d["summary"] and "half" not in d["rows"][0]


def test_the_neighbour_is_stopped_when_a_question_fails(bench):
    bench.answers(fail=True)
    result = bench.invoke("--targets", "2", "--busy-first-half")
    assert result.exit_code != 0 and "engine gone" in str(result.exception)
    (child,) = bench.neighbours.started
    assert child.returncode is not None  # killed and waited for: no zombie left
