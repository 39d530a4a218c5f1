"""``rag bench ttft``: every question under every TTFT target, and how well
the measured TTFT met the target and how well it was predicted; with
several passes, the questions are asked again after the engine had the
idle time to store the passages the first pass wished for (passage KV
reuse, when it is on), so cold and warm stores are compared. With a busy
first half, a CPU-bound neighbour spins on one core for the first half of
the questions and is stopped for the second, and each half is reported on
its own: how soon the plan comes back once a busy period is over.

:func:`run` is the whole of ``rag bench ttft``: the corpus indexed, the
pipeline calibrated, the questions asked, and the plot drawn if asked for.

Does not: assert anything; the figures are for people to read and compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Optional, Sequence

from engine.backend import LoadAware, PassageKV, PrefixCache

from ..qa.pipeline import Pipeline
from ..evaluation.questions import Question
from ..evaluation.stats import quantile
from . import setup
from .setup import Harness

SETTLE_S = 600.0  # the longest wait between passes for the engine to finish warming its passage store


def settle(pipeline: Pipeline, limit_s: float = SETTLE_S) -> float:
    """Wait until the engine has no passage left to warm and nothing to run;
    the seconds waited."""
    backend, began = pipeline.backend, time.perf_counter()
    while time.perf_counter() - began < limit_s:
        now = backend.load() if isinstance(backend, LoadAware) else None
        stats = backend.cache_stats() if isinstance(backend, PrefixCache) else {}
        if not stats.get("passage_warm_queue") and (now is None or not (now.active or now.waiting)):
            break
        time.sleep(0.2)
    return time.perf_counter() - began


@contextmanager
def neighbour() -> Iterator[subprocess.Popen]:
    """A CPU-bound neighbour while the block runs: a child process spinning
    on one core (the last this process may use, where the system can pin
    it), killed and reaped on leaving."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(child.pid, {max(os.sched_getaffinity(0))})
            except OSError:
                pass  # unpinned it still takes a core's worth of time
        yield child
    finally:
        child.kill()
        child.wait()


def _row(number: int, target: float, pass_: int, answer) -> dict[str, object]:
    t, b = answer.timings, answer.budget
    return {
        "pass": pass_, "target_s": target, "question": number, "ttft_s": round(t.ttft_s, 4),
        "predicted_ttft_s": round(b.predicted_ttft_s, 4), "planned_ttft_s": round(b.planned_ttft_s or 0, 4),
        "feasible": b.feasible, "chosen": b.chosen, "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens, "prefill_tokens": t.prefill_tokens, "prefill_s": round(t.prefill_s, 4),
        "spliced_tokens": t.spliced_tokens, "planned_spliced": sum(1 for d in b.decisions if d.spliced),
        "ratio": round(t.ttft_s / target, 4),
        "pred_err": round(abs(b.predicted_ttft_s - t.ttft_s) / t.ttft_s, 4),
        # Where the error lies: the prompt's evaluation, or the time around it (planning, queue, first step).
        "predicted_prefill_s": round(b.predicted_prefill_s, 4),
        "other_s": round(t.ttft_s - t.prefill_s, 4),
        "predicted_other_s": round(b.predicted_ttft_s - b.predicted_prefill_s, 4),
    }


def bench_ttft(
    pipeline: Pipeline,
    questions: Sequence[Question],
    targets: Sequence[float],
    *,
    max_tokens: int = 16,
    passes: int = 1,
    progress: Callable[[int, int], None] | None = None,
    busy_first_half: bool = False,
    busy: Callable[[], ContextManager[object]] = neighbour,
) -> dict[str, object]:
    """Answer every question under every TTFT target (``passes`` times,
    the engine left to settle in between) and report how well the measured
    TTFT met the target and how well it was predicted. ``busy_first_half``:
    ``busy()`` (a CPU-bound neighbour) runs from before the first question
    until half of them are answered; each row says its ``half`` and the
    summary reports each half's adherence."""
    rows: list[dict[str, object]] = []
    total, done, settled = len(questions) * len(targets) * passes, 0, []
    half = total // 2 if busy_first_half else 0
    with _busy_until(busy if busy_first_half else None) as stop:
        for pass_ in range(1, passes + 1):
            if pass_ > 1:
                settled.append(round(settle(pipeline), 1))
            for target in targets:
                for number, q in enumerate(questions, start=1):
                    if done == half:
                        stop()
                    row = _row(number, target, pass_, pipeline.ask(q.question, target_ttft=target,
                                                                   max_tokens=max_tokens))
                    if busy_first_half:
                        row["half"] = "busy" if done < half else "quiet"
                    rows.append(row)
                    done += 1
                    if progress:
                        progress(done, total)
    summary = [_summary(rows, pass_, target) for pass_ in range(1, passes + 1) for target in targets]
    halves = {"halves": [_half(rows, name) for name in ("busy", "quiet")]} if busy_first_half else {}
    backend = pipeline.backend
    return {
        "bench": "ttft",
        "config": {
            "targets": list(targets), "questions": len(questions), "max_tokens": max_tokens, "passes": passes,
            "learn": pipeline.costs.learn, "engine": backend.name, "index": str(pipeline.index_location),
            "splice_fresh": backend.splice_fresh if isinstance(backend, PassageKV) else None, "settled_s": settled,
            "busy_first_half": busy_first_half,
        },
        "rows": rows,
        "summary": {"targets": summary, **halves},
    }


@contextmanager
def _busy_until(busy: Callable[[], ContextManager[object]] | None) -> Iterator[Callable[[], None]]:
    """``busy()`` entered now (none: nothing), and a function that leaves it,
    once; left on the way out in any case."""
    block = busy() if busy is not None else None
    if block is not None:
        block.__enter__()
    state = {"open": block is not None}

    def stop() -> None:
        if state["open"]:
            state["open"] = False
            block.__exit__(None, None, None)

    try:
        yield stop
    finally:
        stop()


def _adherence(mine: Sequence[dict]) -> dict[str, object]:
    """How well ``mine`` (rows) met their targets: measured ÷ target at the
    median and 95th percentile, passages, prediction error."""
    ratios, errors = [r["ratio"] for r in mine], [r["pred_err"] for r in mine]
    return {
        "requests": len(mine),
        "p50_ratio": round(quantile(ratios, 0.5), 3),
        "p95_ratio": round(quantile(ratios, 0.95), 3),
        "mean_chunks": round(sum(r["chosen"] for r in mine) / len(mine), 2),
        "pred_err_p50": round(quantile(errors, 0.5), 3),
        "pred_err_p95": round(quantile(errors, 0.95), 3),
    }


def _half(rows: Sequence[dict], name: str) -> dict[str, object]:
    """The adherence of one half of a ``busy_first_half`` run, over all its targets."""
    mine = [r for r in rows if r.get("half") == name]
    return {"half": name, **(_adherence(mine) if mine else {"requests": 0})}


def _summary(rows: Sequence[dict], pass_: int, target: float) -> dict[str, object]:
    """The figures of one pass at one target."""
    mine = [r for r in rows if r["target_s"] == target and r["pass"] == pass_]
    ratios = [r["ratio"] for r in mine]
    errors = [r["pred_err"] for r in mine]
    return {
        "pass": pass_,
        "target_s": target,
        # Infeasible: even one chunk could not be planned within the target.
        "feasible": all(r["feasible"] for r in mine),
        "infeasible_requests": sum(1 for r in mine if not r["feasible"]),
        "requests": len(mine),
        "p50_ratio": round(quantile(ratios, 0.5), 3),
        "p95_ratio": round(quantile(ratios, 0.95), 3),
        "over_share": round(sum(1 for x in ratios if x > 1.0) / len(ratios), 3),
        "mean_chunks": round(sum(r["chosen"] for r in mine) / len(mine), 2),
        "mean_prompt_tokens": round(sum(r["prompt_tokens"] for r in mine) / len(mine), 1),
        "mean_spliced_tokens": round(sum(r["spliced_tokens"] for r in mine) / len(mine), 1),
        "pred_err_p50": round(quantile(errors, 0.5), 3),
        "pred_err_p95": round(quantile(errors, 0.95), 3),
    }


def run(h: Harness, corpus: Path, questions: Path, targets: Sequence[float], *, index: Optional[Path] = None,
        include: Sequence[str] = (), model: Optional[Path] = None, max_tokens: int = 16, learn: bool = True,
        passes: int = 1, busy_first_half: bool = False, plot: Optional[Path] = None) -> dict[str, object]:
    """``rag bench ttft``: ``corpus`` indexed, the pipeline calibrated, then
    every question of the ``questions`` file answered under every target
    (:func:`bench_ttft`); KV snapshots and stored passages kept in RAM only,
    so every run starts cold. ``plot``: also drawn into that SVG or PNG
    (checked before anything runs). ``learn``: False freezes the cost model."""
    from ..evaluation.plot import check_plot_path, plot_ttft

    if plot is not None:
        check_plot_path(plot)
    qs = setup.questions_of(questions)
    pipeline = setup.bench_pipeline(h, corpus, include, index, model, learn=learn, kv_dir=False)
    pipeline.prepare()  # calibrate, if needed, before anything is timed
    with h.counting("asking") as update:
        result = bench_ttft(pipeline, qs, targets, max_tokens=max_tokens, passes=passes, progress=update,
                            busy_first_half=busy_first_half)
    if plot is not None:
        plot_ttft(result, plot)
    return result


def main() -> None:
    """``python -m rag.bench.ttft``: ``rag bench ttft`` on its own."""
    setup.command_alone("ttft")


if __name__ == "__main__":
    main()
