"""``rag bench answers --evidence-only``: the evidence without the model.

For each question with key facts, the prompt is planned as ``rag ask``
would plan it at the target (retrieval, the budget, the evidence; nothing
is generated), and scored: whether the evidence alone (at most 60 words,
about and text) states every fact, and whether the prompt's passages do
(the ceiling a choice among their sentences can reach). For questions the
documents do not answer, only the best evidence score is kept: a floor
under which ``rag ask`` says the documents do not seem to answer must
stay below every answerable question's score and should sit above these.
Runs in seconds, so the ranking method and the floor are chosen here;
where the evidence goes in the prompt needs the model (``bench answers``).

:func:`run` is the whole of ``rag bench answers --evidence-only``.

Does not: generate, or tune anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from ..qa.pipeline import Pipeline
from ..evaluation.grading import GoldQuestion, facts_found
from ..evaluation.questions import json_lines
from ..evaluation.stats import mean
from . import setup
from .answers import MAX_EVIDENCE_WORDS, questions_and_pipeline
from .setup import Harness


def bench_evidence(pipeline: Pipeline, questions: Sequence[GoldQuestion], unanswerable: Sequence[str], *,
                   target_ttft: float, options: dict | None = None,
                   progress: Callable[[int, int], None] | None = None) -> dict[str, object]:
    """The evidence of each question's planned prompt, scored against its
    facts; the best evidence score of each question of ``unanswerable``."""
    from ..qa.options import AskOptions

    options = dict(options or {})
    asked = AskOptions.of(**options)
    rows: list[dict[str, object]] = []
    total = len(questions) + len(unanswerable)
    for number, q in enumerate(questions, 1):
        prompt = pipeline.planned(q.question, target_ttft=target_ttft, **options)
        ranked = pipeline.evidence(q.question, pipeline.search(q.question, k=asked.candidates), asked)
        quoted = " ".join(f"{e.about} {e.text}" for e in prompt.evidence)
        words = len(quoted.split())
        passages = "\n\n".join(h.text for h in prompt.hits)
        rows.append({
            "question": number, "answerable": True, "best_score": round(ranked.best, 4),
            "evidence_right": bool(prompt.evidence) and words <= MAX_EVIDENCE_WORDS
            and all(facts_found(quoted, q.facts)),
            "evidence_words": words, "prompt_states_facts": all(facts_found(passages, q.facts)),
            "chunks": len(prompt.hits), "evidence_s": ranked.seconds, "evidence": quoted[:400],
        })
        if progress:
            progress(number, total)
    for number, question in enumerate(unanswerable, 1):
        ranked = pipeline.evidence(question, pipeline.search(question, k=asked.candidates), asked)
        rows.append({"question": question, "answerable": False, "best_score": round(ranked.best, 4),
                     "evidence_s": ranked.seconds})
        if progress:
            progress(len(questions) + number, total)
    answerable = [r for r in rows if r["answerable"]]
    others = [r for r in rows if not r["answerable"]]
    lowest = min((r["best_score"] for r in answerable), default=None)
    highest_other = max((r["best_score"] for r in others), default=None)
    return {
        "bench": "answers-evidence",
        "config": {"questions": len(questions), "unanswerable": len(unanswerable), "target_ttft_s": target_ttft,
                   "options": options, "evidence_max_words": MAX_EVIDENCE_WORDS},
        "rows": rows,
        "summary": {
            "evidence_right": sum(1 for r in answerable if r["evidence_right"]),
            "prompt_states_facts": sum(1 for r in answerable if r["prompt_states_facts"]),
            "questions": len(answerable),
            "mean_evidence_words": round(mean(r["evidence_words"] for r in answerable), 1),
            "mean_evidence_ms": round(1000 * mean(r["evidence_s"] for r in rows), 2),
            "lowest_answerable_score": lowest, "highest_unanswerable_score": highest_other,
            # A floor between the two declines every unanswerable question and no answerable one.
            "floor_separates": lowest is not None and highest_other is not None and highest_other < lowest,
        },
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, questions: Optional[Path] = None, limit: int = 0,
        unanswerable: Optional[Path] = None, target_ttft: float | None = None, options: dict | None = None,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench answers --evidence-only``: the questions of
    :func:`rag.bench.answers.questions_and_pipeline` and those of ``unanswerable`` (JSON
    lines of ``{question}``; default: the bundled set) planned and their
    evidence scored (:func:`bench_evidence`), no answer generated."""
    qs, target, pipeline = questions_and_pipeline(h, corpus, include, questions, limit, target_ttft, index, model)
    others = json_lines(unanswerable or setup.BENCH_DATA / "python_docs_unanswerable.jsonl",
                        lambda raw: str(raw["question"]), "a line with 'question'")
    with h.counting("questions") as update:
        return bench_evidence(pipeline, qs, others, target_ttft=target, options=options, progress=update)
