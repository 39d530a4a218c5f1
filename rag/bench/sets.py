"""``rag bench answers --half tuning|heldout|all``: one question set
scored as a user meets it, answerable and unanswerable questions together.

A set (``rag/bench/data/*.jsonl``, see its README) is split once, at
random with a fixed seed (:data:`SPLIT_SEED`), into a tuning half and a
held-out half, each holding its share of the unanswerable questions and of
each language. The constants of the evidence, the decline and the passage
choice are chosen on the tuning half; the held-out half is scored once per
change and reported beside it.

Each question is asked once as ``rag ask`` would (the floor given), timed
from the call to the first text a reader sees beside the engine's own
TTFT; a question declined is asked again with the floor at 0, so the
decline's cost is measured paired: a declined answerable question the model
would have answered right is a right answer lost. Each question is also
planned (nothing generated) at every target of ``targets``, giving passages
per prompt and whether a gold passage is in it, against the target.

:func:`run` is the whole of it.

Does not: choose a constant; it reports what the constants give.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..qa.options import AskOptions
from ..qa.pipeline import Pipeline
from . import setup
from .answers import MAX_EVIDENCE_WORDS
from .grading import GoldQuestion, facts_found, load_gold
from .setup import Harness
from .peer import WARM_UP_QUESTION
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


def _evidence_text(evidence) -> str:
    return " ".join(f"{e.about} {e.text}" for e in evidence)


def _asked(pipeline: Pipeline, question: str, options: dict) -> tuple[object, float]:
    """The answer to ``question`` and the seconds from the call to its first
    text (a declined answer's text comes at once)."""
    started = time.perf_counter()
    seen = None
    with pipeline.stream(question, **options) as stream:
        for _ in stream:
            if seen is None:
                seen = time.perf_counter() - started
        answer = stream.answer
    return answer, seen if seen is not None else time.perf_counter() - started


def bench_set(pipeline: Pipeline, questions: Sequence[GoldQuestion], *, target_ttft: float, floor: float,
              max_tokens: int = 64, targets: Sequence[float] = (1.0, 2.0, 4.0), options: dict | None = None,
              evidence_only: bool = False, progress: Callable[[int, int], None] | None = None) -> dict[str, object]:
    """Every question of the set planned at each of ``targets`` and, unless
    ``evidence_only``, asked at ``target_ttft`` with the evidence ``floor``
    (asked again at floor 0 where declined); rows per question and the
    set's figures (:func:`summarise`)."""
    options = dict(options or {})
    asked = AskOptions.of(**{k: v for k, v in options.items() if k != "evidence_floor"})
    pipeline.cost_model  # calibrated, if needed, before anything is timed
    if not evidence_only:
        pipeline.warm_up()
        _asked(pipeline, WARM_UP_QUESTION, dict(options, target_ttft=target_ttft, max_tokens=max_tokens))
    rows = []
    for number, q in enumerate(questions, 1):
        ranked = pipeline.evidence(q.question, pipeline.search(q.question, k=asked.candidates), asked)
        row: dict[str, object] = {"id": q.id or number, "lang": q.lang, "answerable": q.answerable,
                                  "best_score": round(ranked.best, 4), "would_decline": ranked.declines(floor),
                                  "unheard": list(ranked.unheard)}
        if q.answerable:
            # Where the answer is lost (issue 54): the unit ranked first names the facts, or only some unit
            # of the prompt's passages does (the ceiling of any choice among them).
            row["top_unit_right"] = bool(ranked.units) and all(facts_found(_unit_text(ranked.units[0]), q.facts))
        for t in sorted(set(targets) | {target_ttft}):
            plan = pipeline.planned(q.question, **options, evidence_floor=0.0, target_ttft=t)
            row[f"chunks_at_{t:g}"] = len(plan.hits)
            row[f"gold_at_{t:g}"] = any(h.source in q.gold for h in plan.hits) if q.answerable else None
            if t == target_ttft:
                quoted = _evidence_text(plan.evidence)
                row["evidence_words"] = len(quoted.split())
                row["evidence_right"] = (bool(plan.evidence) and len(quoted.split()) <= MAX_EVIDENCE_WORDS
                                         and all(facts_found(quoted, q.facts))) if q.answerable else None
                row["evidence"] = quoted[:400]
                row["prompt_states_facts"] = (all(facts_found("\n\n".join(h.text for h in plan.hits), q.facts))
                                              if q.answerable else None)
                row["prompt_unit_right"] = (any(all(facts_found(_unit_text(u, h), q.facts))
                                                for h in plan.hits for u in h.units)
                                            if q.answerable else None)
        if not evidence_only:
            run = dict(options, target_ttft=target_ttft, max_tokens=max_tokens)
            answer, seen = _asked(pipeline, q.question, dict(run, evidence_floor=floor))
            row.update(_answered(answer, seen, q))
            if answer.declined:  # paired: what the model would have said, asked anyway
                again, _ = _asked(pipeline, q.question, dict(run, evidence_floor=0.0))
                row["right_if_asked"] = all(facts_found(again.answer, q.facts)) if q.answerable else None
                row["answer_if_asked"] = again.answer.strip()[:300]
        rows.append(row)
        if progress:
            progress(number, len(questions))
    return {"rows": rows, "summary": summarise(rows, target_ttft, targets, evidence_only)}


def _unit_text(unit, hit=None) -> str:
    """A ranked unit (or a hit's stored one) as the evidence would show it whole: its about, then its text."""
    text = unit.text if hit is None else hit.text[unit.start:unit.end]
    return f"{unit.about} {text}"


def _answered(answer, seen: float, q: GoldQuestion) -> dict[str, object]:
    quoted = _evidence_text(answer.evidence)
    # Paired (issue 54): the evidence this very answer was given names the facts; does the answer keep them?
    evidence_named = (bool(answer.evidence) and all(facts_found(quoted, q.facts))) if q.answerable else None
    return {"declined": answer.declined, "right": all(facts_found(answer.answer, q.facts)) if q.answerable else None,
            "asked_evidence_right": evidence_named,
            "answer": answer.answer.strip()[:300], "ttft_s": round(answer.timings.ttft_s, 4),
            "seen_s": round(seen, 4), "chunks": len(answer.sources),
            "prompt_has_gold": any(s.source in q.gold for s in answer.sources) if q.answerable else None}


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


def run(h: Harness, corpora: Sequence[Path], include: Sequence[str], *, questions: Path, half: str,
        target_ttft: float | None = None, max_tokens: int = 64, floor: float | None = None,
        targets: Sequence[float] = (1.0, 2.0, 4.0), options: dict | None = None, evidence_only: bool = False,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench answers --questions FILE --half HALF``: the half of the
    set in ``questions`` scored over an index of ``corpora`` (each folder's
    files matching ``include``) by :func:`bench_set`; ``floor`` defaults to
    the settings' evidence floor, ``target_ttft`` to theirs, else 2 s."""
    qs = half_of(load_gold(questions), half)
    settings = h.settings(model=model)
    target = target_ttft or settings.target_ttft or 2.0
    floor = settings.evidence_floor if floor is None else floor
    pipeline = setup.bench_pipeline(h, corpora, include, index, model, kv_dir=False)
    try:
        pipeline.prepare()
        with h.counting("questions") as update:
            result = bench_set(pipeline, qs, target_ttft=target, floor=floor, max_tokens=max_tokens, targets=targets,
                               options=options, evidence_only=evidence_only, progress=update)
        model_path = pipeline.backend.describe().get("model_path", pipeline.backend.name)
    finally:
        pipeline.close()
    return {"bench": "answers-set",
            "config": {"questions": str(questions), "half": half, "split_seed": SPLIT_SEED, "asked": len(qs),
                       "target_ttft_s": target, "targets_s": sorted(set(targets) | {target}),
                       "evidence_floor": floor, "max_tokens": max_tokens, "evidence_only": evidence_only,
                       "evidence_max_words": MAX_EVIDENCE_WORDS, "corpora": [str(c) for c in corpora],
                       "include": list(include), "model": str(model_path), "options": options or {},
                       "interval": "bootstrap 95 % over questions, 2,000 resamples, seed 0"},
            **result}
