"""``rag bench ttft``: every question under every TTFT target, and how well
the measured TTFT met the target and how well it was predicted.

Does not: assert anything; the figures are for people to read and compare.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..qa.pipeline import Pipeline
from .questions import Question
from .stats import quantile


def bench_ttft(
    pipeline: Pipeline,
    questions: Sequence[Question],
    targets: Sequence[float],
    *,
    max_tokens: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Answer every question under every TTFT target and report how well
    the measured TTFT met the target and how well it was predicted."""
    rows: list[dict[str, object]] = []
    total, done = len(questions) * len(targets), 0
    for target in targets:
        for number, q in enumerate(questions, start=1):
            answer = pipeline.ask(q.question, target_ttft=target, max_tokens=max_tokens)
            t, b = answer.timings, answer.budget
            rows.append(
                {
                    "target_s": target, "question": number, "ttft_s": round(t.ttft_s, 4),
                    "predicted_ttft_s": round(b.predicted_ttft_s, 4), "planned_ttft_s": round(b.planned_ttft_s or 0, 4),
                    "feasible": b.feasible, "chosen": b.chosen, "prompt_tokens": t.prompt_tokens,
                    "cached_tokens": t.cached_tokens, "prefill_tokens": t.prefill_tokens, "prefill_s": round(t.prefill_s, 4),
                    "ratio": round(t.ttft_s / target, 4),
                    "pred_err": round(abs(b.predicted_ttft_s - t.ttft_s) / t.ttft_s, 4),
                }
            )
            done += 1
            if progress:
                progress(done, total)
    summary = []
    for target in targets:
        mine = [r for r in rows if r["target_s"] == target]
        ratios = [r["ratio"] for r in mine]
        errors = [r["pred_err"] for r in mine]
        summary.append(
            {
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
                "pred_err_p50": round(quantile(errors, 0.5), 3),
                "pred_err_p95": round(quantile(errors, 0.95), 3),
            }
        )
    return {
        "bench": "ttft",
        "config": {
            "targets": list(targets), "questions": len(questions), "max_tokens": max_tokens,
            "learn": pipeline.costs.learn, "engine": pipeline.backend.name, "index": str(pipeline.index_dir),
        },
        "rows": rows,
        "summary": {"targets": summary},
    }
