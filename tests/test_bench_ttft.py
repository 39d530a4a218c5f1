"""``rag bench ttft --busy-first-half``: a neighbour for the first half of the
questions, none for the second, and each half reported on its own. Pure
logic: a pipeline that answers from a formula; the bench is not run."""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

from rag.bench import ttft
from rag.bench.questions import Question


class Answers:
    """A pipeline whose answers take 1.5 s with 3 passages beside a
    neighbour and 1 s with 6 without (it asks ``busy`` which)."""

    def __init__(self) -> None:
        self.asked, self.busy = 0, False
        self.backend = SimpleNamespace(name="fake")
        self.costs = SimpleNamespace(learn=True)
        self.index_location = "index"

    def ask(self, question, *, target_ttft, max_tokens):
        self.asked += 1
        ttft_s, chosen = (1.5, 3) if self.busy else (1.0, 6)
        timings = SimpleNamespace(ttft_s=ttft_s, prompt_tokens=100, cached_tokens=0, prefill_tokens=100,
                                  prefill_s=ttft_s, spliced_tokens=0)
        budget = SimpleNamespace(predicted_ttft_s=ttft_s, planned_ttft_s=ttft_s, feasible=True, chosen=chosen,
                                 decisions=(), predicted_prefill_s=ttft_s)
        return SimpleNamespace(timings=timings, budget=budget)


def test_the_neighbour_runs_for_the_first_half_and_each_half_is_reported():
    pipeline, events = Answers(), []

    @contextmanager
    def neighbour():
        events.append(("start", pipeline.asked))
        pipeline.busy = True
        yield
        pipeline.busy = False
        events.append(("stop", pipeline.asked))

    questions = [Question(f"q{i}", ()) for i in range(5)]
    result = ttft.bench_ttft(pipeline, questions, [2.0, 4.0], busy_first_half=True, busy=neighbour)
    assert events == [("start", 0), ("stop", 5)]  # before the first question, once half of the ten were answered
    assert [r["half"] for r in result["rows"]] == ["busy"] * 5 + ["quiet"] * 5
    busy, quiet = result["summary"]["halves"]
    assert (busy["half"], busy["requests"], busy["mean_chunks"]) == ("busy", 5, 3.0)
    assert (quiet["half"], quiet["requests"], quiet["mean_chunks"]) == ("quiet", 5, 6.0)
    assert quiet["p50_ratio"] < busy["p50_ratio"] and quiet["p95_ratio"] <= 0.5
    assert result["config"]["busy_first_half"] is True
    json.dumps(result)  # the summary is plain JSON


def test_without_the_option_no_neighbour_and_no_halves():
    pipeline, started = Answers(), []
    result = ttft.bench_ttft(pipeline, [Question("q", ())], [2.0], busy=lambda: started.append(1))
    assert not started and "halves" not in result["summary"] and "half" not in result["rows"][0]


def test_the_neighbour_is_stopped_when_a_question_fails():
    pipeline, events = Answers(), []

    @contextmanager
    def neighbour():
        events.append("start")
        try:
            yield
        finally:
            events.append("stop")

    def fail(*args, **kwargs):
        raise RuntimeError("engine gone")

    pipeline.ask = fail
    try:
        ttft.bench_ttft(pipeline, [Question("q", ())] * 4, [2.0], busy_first_half=True, busy=neighbour)
    except RuntimeError:
        pass
    assert events == ["start", "stop"]


def test_the_neighbour_is_a_child_process_that_is_reaped():
    with ttft.neighbour() as child:
        assert child.poll() is None  # spinning
    assert child.returncode is not None  # killed and waited for: no zombie left


def test_the_command_passes_the_option_and_prints_each_half(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from rag import cli
    from rag.bench import setup

    seen = {}
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "q?", "gold": ["a.md"]}\n')
    pipeline = SimpleNamespace(prepare=lambda: None)
    monkeypatch.setattr(setup, "bench_pipeline", lambda *a, **k: pipeline)

    real = ttft.bench_ttft

    def fake_bench(p, qs, targets, **options):
        seen.update(options)
        return real(Answers(), qs * 4, targets, busy_first_half=options["busy_first_half"],
                               busy=contextmanager(lambda: (yield)))

    monkeypatch.setattr(ttft, "bench_ttft", fake_bench)
    runner = CliRunner()
    out = runner.invoke(cli.app, ["bench", "ttft", "--corpus", str(tmp_path), "--questions", str(questions),
                                  "--targets", "2", "--busy-first-half"])
    assert out.exit_code == 0, out.output
    assert seen["busy_first_half"] is True and "neighbour for the first half" in out.output
    out = runner.invoke(cli.app, ["bench", "ttft", "--corpus", str(tmp_path), "--questions", str(questions),
                                  "--targets", "2", "--json"])
    assert out.exit_code == 0 and seen["busy_first_half"] is False
    assert "halves" not in json.loads(out.stdout)["summary"]
