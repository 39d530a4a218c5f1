"""A question set's two halves, and its figures.

A set (``rag/bench/data/*.jsonl``, see its README) is split once, at
random with a fixed seed (:data:`SPLIT_SEED`), into a tuning half and a
held-out half, each holding its share of the unanswerable questions and of
each language (:func:`split`). :func:`summarise` gives the figures of one
set's rows, each share with a bootstrap 95 % interval.

Does not: ask anything; ``rag bench answers --half`` (``rag.bench.sets``)
makes the rows.
"""

from __future__ import annotations

import random
from typing import Sequence

from .grading import GoldQuestion
from .stats import bootstrap_interval, mean, percentile

SPLIT_SEED = 44  # the issue that asked for the split; never changed once a set was split by it
HALVES = ("tuning", "heldout", "all")


def split(questions: Sequence[GoldQuestion], seed: int = SPLIT_SEED) -> tuple[list[GoldQuestion], list[GoldQuestion]]:
    """The tuning and held-out halves of ``questions``: within each group of
    the same answerability and language, shuffled by ``seed`` and cut in
    two (an odd one goes to tuning); each half keeps the file's order."""
    rng = random.Random(seed)
    groups: dict[tuple[bool, str], list[int]] = {}
    for i, q in enumerate(questions):
        groups.setdefault((q.answerable, q.lang), []).append(i)
    tuning: set[int] = set()
    for key in sorted(groups):
        members = groups[key]
        rng.shuffle(members)
        tuning.update(members[: (len(members) + 1) // 2])
    return ([q for i, q in enumerate(questions) if i in tuning],
            [q for i, q in enumerate(questions) if i not in tuning])


def half_of(questions: Sequence[GoldQuestion], half: str) -> list[GoldQuestion]:
    """The ``half`` ("tuning", "heldout" or "all") of ``questions``."""
    if half == "all":
        return list(questions)
    tuning, heldout = split(questions)
    return tuning if half == "tuning" else heldout


def _share(rows: Sequence[dict], key: str) -> dict[str, object]:
    """How many of ``rows`` have ``key`` true, of how many, with a bootstrap 95 % interval of the share."""
    values = [1.0 if r[key] else 0.0 for r in rows if r.get(key) is not None]
    if not values:
        return {"count": 0, "of": 0, "share": None, "ci95": None}
    return {"count": int(sum(values)), "of": len(values), "share": round(mean(values), 3),
            "ci95": bootstrap_interval(values, mean)}


def summarise(rows: Sequence[dict], target: float, targets: Sequence[float], evidence_only: bool) -> dict[str, object]:
    """The issue's figures for one set: answers right, evidence right (at
    most 60 words), answerable and unanswerable questions declined, the
    declines that cost a right answer, passages per prompt and gold passage
    in the prompt (at each target), TTFT p50/p95 (engine and seen) against
    the target, each share with a bootstrap 95 % interval."""
    answerable = [r for r in rows if r["answerable"]]
    others = [r for r in rows if not r["answerable"]]
    out: dict[str, object] = {
        "questions": len(rows), "answerable": len(answerable), "unanswerable": len(others),
        "evidence_right": _share(answerable, "evidence_right"),
        "top_unit_right": _share(answerable, "top_unit_right"),
        "prompt_unit_right": _share(answerable, "prompt_unit_right"),
        "prompt_states_facts": _share(answerable, "prompt_states_facts"),
        "by_target": [{"target_s": t, "mean_chunks": round(mean(r[f"chunks_at_{t:g}"] for r in answerable), 2)
                       if answerable else None, "gold_in_prompt": _share(answerable, f"gold_at_{t:g}")}
                      for t in sorted(set(targets) | {target})],
        "lowest_answerable_score": min((r["best_score"] for r in answerable), default=None),
        "highest_unanswerable_score": max((r["best_score"] for r in others), default=None),
        "would_decline_answerable": _share(answerable, "would_decline"),
        "would_decline_unanswerable": _share(others, "would_decline"),
    }
    if evidence_only:
        return out
    ttfts = [float(r["ttft_s"]) for r in rows]
    seen = [float(r["seen_s"]) for r in rows]
    asked = [r for r in rows if not r["declined"]]
    out.update({
        "right": _share(answerable, "right"),
        "declined_answerable": _share(answerable, "declined"),
        "declined_unanswerable": _share(others, "declined"),
        # A declined answerable question the model, asked anyway, answered right: what the decline cost.
        "declines_that_cost_a_right_answer": sum(1 for r in answerable if r["declined"] and r.get("right_if_asked")),
        "mean_chunks": round(mean(r["chunks"] for r in asked), 2) if asked else None,
        "gold_in_prompt": _share([r for r in answerable if not r["declined"]], "prompt_has_gold"),
        # Of the answers whose own evidence named the facts, how many name them too (paired).
        "answer_keeps_evidence": _share([r for r in answerable if r.get("asked_evidence_right")], "right"),
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p95_s": percentile(ttfts, 0.95),
        "ttft_p95_ci95": bootstrap_interval(ttfts, lambda v: percentile(v, 0.95)),
        "ttft_p95_over_target": round(percentile(ttfts, 0.95) / target, 3),
        "seen_p50_s": percentile(seen, 0.5), "seen_p95_s": percentile(seen, 0.95),
        "seen_p95_over_target": round(percentile(seen, 0.95) / target, 3),
        "asked_ttft_p95_over_target": round(percentile([float(r["ttft_s"]) for r in asked], 0.95) / target, 3)
        if asked else None,
    })
    return out
