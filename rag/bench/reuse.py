"""``rag bench reuse``: passage KV reuse judged by whether the answers stay
right, paired against a full prefill of the same prompt, for one model.

Fidelity. Every question's prompt is planned as ``rag ask`` plans it at the
target, with reuse off (so the prompt does not depend on what earlier
questions left), then answered greedily, each run starting from the system
prompt alone (no idle sequence holds the prompt):

* ``full``: a full prefill;
* ``exact``: the prompt's segments taken from the store as an earlier run
  of the same prompt left them (lossless reuse, the default);
* ``prefix cache``: as many leading tokens as ``exact`` found held, left
  cached by an idle sequence instead (llama.cpp's own prefix cache): a
  prompt evaluated in two parts is not bit for bit one evaluated at once,
  so this is what ``exact`` must equal, answer for answer;
* ``R=n``: each passage stored behind the system prompt alone and spliced
  in, its first n tokens evaluated again (lossy, off by default).

Each answer, as the pipeline would show it (cut at a stop sequence,
invented citations removed), is scored against the question's key facts
(``grading``).
Per mode: answers right, the questions only it or only the full prefill got
right, the share of answers identical to the full prefill's, and a paired
bootstrap interval of the accuracy difference.

Passes. The questions are asked twice in turn through the pipeline at the
target with exact reuse off, then twice with it on (its store emptied
first), answers graded: the passages each pass could afford, and whether
the answers stay as right when the second pass takes the passages it holds.
Idle sequences forget their prompts before each question, so what a prompt
finds held comes from the store, not from the question just before.

:func:`run` is the whole of ``rag bench reuse``: the corpus indexed, the
pipeline calibrated, every question measured.

Does not: choose a default (the figures are for people), or grade with a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from engine.llama_cpp.snapshots import SnapshotCache

from ..errors import RagError
from ..qa.citations import Grounding, GroundedText
from ..qa.pipeline import Pipeline
from ..qa.planner import PlannedPrompt
from ..evaluation.grading import GoldQuestion, is_right, load_gold
from ..evaluation.stats import bootstrap_interval, mean, percentile
from . import setup
from .setup import Harness

FULL, EXACT, PREFIX = "full", "exact", "prefix cache"
PASSES = 2


def _empty_store(backend, *, fresh: int | None, exact: bool) -> None:
    """The engine's passage store emptied (RAM only) and set to ``fresh`` and ``exact``."""
    store = backend.passages
    store.start_over(SnapshotCache(store.cache.max_bytes, None, 0))
    store.use(fresh=fresh, exact=exact)


class _Prompt:
    """One planned prompt, answered from the system prompt alone in each mode."""

    def __init__(self, backend, tokens: list[int], passages: Sequence[str], max_tokens: int) -> None:
        self.backend, self.tokens, self.passages, self.max_tokens = backend, tokens, tuple(passages), max_tokens

    def answer(self, *, fresh: int | None = None, exact: bool = False, prefix: int = 0):
        """The answer and timings; with ``prefix``, the prompt's first
        ``prefix`` tokens are left cached by an idle sequence first."""
        self.backend.passages.use(fresh=fresh, exact=exact)
        self.backend.forget_prompts()
        if prefix:
            self.backend.generate(self.tokens[:prefix], max_tokens=1).result()
        reuse = fresh is not None or exact
        return self.backend.generate(self.tokens, max_tokens=self.max_tokens,
                                     passages=self.passages if reuse else ()).result()


def shown(text: str, planned: PlannedPrompt) -> str:
    """``text`` as the pipeline shows an answer to ``planned``: cut at a stop
    sequence, citations to passages or files it did not show removed."""
    guard = GroundedText(Grounding(len(planned.hits), tuple(h.source for h in planned.hits), planned.text))
    out = guard.feed(text)
    return out if guard.stopped else out + guard.finish()


def _fidelity(pipeline: Pipeline, number: int, q: GoldQuestion, fresh: Sequence[int], target: float | None,
              max_tokens: int) -> list[dict[str, object]]:
    """One question's rows: the full prefill, exact reuse and each R."""
    backend = pipeline.backend
    _empty_store(backend, fresh=None, exact=False)  # planned and answered with nothing held
    planned = pipeline.planned(q.question, target_ttft=target, no_target=target is None, max_tokens=max_tokens)
    prompt = _Prompt(backend, backend.tokenize(planned.text), planned.passages, max_tokens)
    raw, cold = prompt.answer()
    full_text = shown(raw, planned)
    prompt.answer(exact=True)  # a full prefill too (the store is empty) that keeps the prompt's segments
    runs = [(EXACT, prompt.answer(exact=True))]
    # llama.cpp's own prefix cache holding as many tokens: what exact reuse must equal.
    runs.append((PREFIX, prompt.answer(prefix=runs[0][1][1].cached_tokens)))
    for r in fresh:
        backend.precompute_passages(planned.passages)
        runs.append((f"R={r}", prompt.answer(fresh=r)))
    full_right = is_right(full_text, q)
    rows = [{"question": number, "mode": FULL, "right": full_right, "same_as_full": True,
             "ttft_s": round(cold.ttft_s, 4), "spliced_tokens": 0, "prompt_tokens": cold.prompt_tokens,
             "passages": len(planned.passages), "answer": full_text}]
    for mode, (raw, t) in runs:
        text = shown(raw, planned)
        rows.append({"question": number, "mode": mode, "right": is_right(text, q), "same_as_full": text == full_text,
                     "ttft_s": round(t.ttft_s, 4), "spliced_tokens": t.spliced_tokens, "prompt_tokens": t.prompt_tokens,
                     "passages": len(planned.passages), "answer": text})
    return rows


def _paired(rows: Sequence[dict], mode: str, base: str, key: str = "mode") -> dict[str, object]:
    """``mode`` against ``base`` over the questions both answered."""
    by = {(r[key], r["question"]): r for r in rows}
    numbers = sorted(n for m, n in by if m == mode and (base, n) in by)
    diffs = [float(by[(mode, n)]["right"]) - float(by[(base, n)]["right"]) for n in numbers]
    return {
        "right": sum(1 for n in numbers if by[(mode, n)]["right"]),
        "only_it_right": sum(1 for d in diffs if d > 0), f"only_{base}_right": sum(1 for d in diffs if d < 0),
        "accuracy_diff": round(mean(diffs), 3) if diffs else None,
        "accuracy_diff_ci95": bootstrap_interval(diffs, mean),
    }


def fidelity_summary(rows: Sequence[dict], modes: Sequence[str]) -> list[dict[str, object]]:
    """Per mode: right answers, paired against the full prefill, identical
    answers and TTFT p50."""
    table = []
    by = {(r["mode"], r["question"]): r["answer"] for r in rows}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        table.append({"mode": mode, "questions": len(mine), **_paired(rows, mode, FULL),
                      "identical": round(mean(1.0 if r["same_as_full"] else 0.0 for r in mine), 3),
                      "identical_to_prefix_cache": round(mean(
                          1.0 if by.get((PREFIX, r["question"])) == r["answer"] else 0.0 for r in mine), 3),
                      "ttft_p50_s": percentile([r["ttft_s"] for r in mine], 0.5),
                      "spliced_tokens": round(mean(r["spliced_tokens"] for r in mine), 1)})
    return table


def _passes(pipeline: Pipeline, questions: Sequence[GoldQuestion], exact: bool, target: float, max_tokens: int,
            tick: Callable[[], None]) -> list[dict[str, object]]:
    """The questions asked ``PASSES`` times in turn with exact reuse on or off."""
    backend = pipeline.backend
    _empty_store(backend, fresh=None, exact=exact)
    rows = []
    for p in range(1, PASSES + 1):
        for number, q in enumerate(questions, 1):
            # Idle sequences forget: what is held comes from the store alone, as on a busy engine
            # whose sequences have served others since (off: the system prompt only).
            backend.forget_prompts()
            a = pipeline.ask(q.question, target_ttft=target, max_tokens=max_tokens)
            rows.append({"reuse": "on" if exact else "off", "pass": p, "question": number,
                         "right": is_right(a.answer, q), "chunks": a.budget.chosen, "ttft_s": round(a.timings.ttft_s, 4),
                         "spliced_tokens": a.timings.spliced_tokens, "prompt_tokens": a.timings.prompt_tokens})
            tick()
    return rows


def passes_summary(rows: Sequence[dict]) -> list[dict[str, object]]:
    """Per reuse setting and pass: accuracy, mean chunks, TTFT p50 and
    spliced tokens; for the passes with reuse on, paired against off."""
    table = []
    for reuse in ("off", "on"):
        for p in range(1, PASSES + 1):
            mine = [r for r in rows if r["reuse"] == reuse and r["pass"] == p]
            if not mine:
                continue
            row = {"reuse": reuse, "pass": p, "questions": len(mine), "right": sum(1 for r in mine if r["right"]),
                   "mean_chunks": round(mean(r["chunks"] for r in mine), 2),
                   "ttft_p50_s": percentile([r["ttft_s"] for r in mine], 0.5),
                   "ttft_p95_s": percentile([r["ttft_s"] for r in mine], 0.95),
                   "spliced_tokens": round(mean(r["spliced_tokens"] for r in mine), 1)}
            if reuse == "on":
                same_pass = [r for r in rows if r["pass"] == p]
                row["vs_off"] = _paired(same_pass, "on", "off", key="reuse")
            table.append(row)
    return table


def bench_reuse(
    pipeline: Pipeline,
    questions: Sequence[GoldQuestion],
    *,
    fresh: Sequence[int] = (0,),
    target_ttft: float = 2.0,
    max_tokens: int = 64,
    passes: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Fidelity rows for every question (full prefill, exact reuse, each R
    in ``fresh``) and, with ``passes``, the two-pass runs with exact reuse
    off and on (see the module). RagError for an engine that keeps no
    passage KV in process."""
    backend = pipeline.backend
    if not hasattr(backend, "passages") or not hasattr(backend, "forget_prompts"):
        raise RagError(f"rag bench reuse needs the in-process llama.cpp engine, not {backend.name}")
    pipeline.cost_model  # calibrated, if needed, before anything is timed
    pipeline.warm_up()
    store = backend.passages
    before = store.fresh, store.exact
    total = len(questions) * (1 + (2 * PASSES if passes else 0))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    rows, pass_rows = [], []
    try:
        for number, q in enumerate(questions, 1):
            rows += _fidelity(pipeline, number, q, fresh, target_ttft, max_tokens)
            tick()
        if passes:
            for exact in (False, True):
                pass_rows += _passes(pipeline, questions, exact, target_ttft, max_tokens, tick)
    finally:
        _empty_store(backend, fresh=before[0], exact=before[1])
    modes = [EXACT, PREFIX, *(f"R={r}" for r in fresh)]
    return {
        "bench": "reuse",
        "config": {"questions": len(questions), "fresh": list(fresh), "target_ttft_s": target_ttft,
                   "max_tokens": max_tokens, "passes": PASSES if passes else 0, "index": str(pipeline.index_location),
                   "model": str(backend.describe().get("model_path", backend.name)),
                   "interval": "paired bootstrap 95 % over questions, 2,000 resamples, seed 0"},
        "rows": rows,
        "pass_rows": pass_rows,
        "summary": {"fidelity": fidelity_summary(rows, [FULL, *modes]), "passes": passes_summary(pass_rows)},
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, questions: Optional[Path] = None, limit: int = 0,
        fresh: Sequence[int] = (0,), max_tokens: int = 64, target_ttft: float = 2.0, passes: bool = True,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench reuse``: ``corpus`` indexed, the pipeline calibrated,
    then the first ``limit`` (0: all) questions of ``questions`` (default:
    the bundled Python-docs answer set) answered in each mode
    (:func:`bench_reuse`); no stored passage is left behind on disk."""
    qs = load_gold(questions or setup.BENCH_DATA / "python_docs_answers.jsonl")
    qs = qs[:limit] if limit else qs
    pipeline = setup.bench_pipeline(h, corpus, include, index, model, kv_dir=False)
    pipeline.prepare()  # calibrate, if needed, before anything is timed
    with h.counting("questions") as update:
        return bench_reuse(pipeline, qs, fresh=fresh, target_ttft=target_ttft, max_tokens=max_tokens,
                           passes=passes, progress=update)


def main() -> None:
    """``python -m rag.bench.reuse``: ``rag bench reuse`` on its own."""
    setup.command_alone("reuse")


if __name__ == "__main__":
    main()
