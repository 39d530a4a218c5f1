"""``rag bench answers --half tuning|heldout|all``: one question set
scored as a user meets it, answerable and unanswerable questions together.

A set (``rag/bench/data/*.jsonl``, see its README) is split once, at
random with a fixed seed (:data:`SPLIT_SEED`), into a tuning half and a
held-out half, each holding its share of the unanswerable questions and of
each language (:mod:`rag.evaluation.sets` splits it, and sums up a set's
rows). The constants of the evidence, the decline and the passage choice
are chosen on the tuning half; the held-out half is scored once per change
and reported beside it.

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

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..evaluation.grading import GoldQuestion, facts_found, load_gold
from ..evaluation.sets import SPLIT_SEED, half_of, summarise
from ..qa.options import AskOptions
from ..qa.pipeline import Pipeline
from . import setup
from .answers import MAX_EVIDENCE_WORDS
from .peer import WARM_UP_QUESTION
from .setup import Harness


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
