"""``rag bench answers``: are the answers right? rag-budget at its TTFT
target, rag-budget with no target, and the classic LangChain RAG (k=4, the
peer of ``rag bench peer``) on the same model answer the same questions,
taking turns; each answer is scored against the question's key facts
(``grading``). Per system: accuracy and median TTFT, each with a bootstrap
95 % interval over questions, token F1 against the reference answer, and
the citations an answer made to passages or files its prompt did not show.

Each of our systems keeps its own passage KV store, and idle sequences
forget the prompt of the turn before: with exact reuse on (the default), a
system reuses what its own earlier questions left, never the passages
another system's turn at the same question just evaluated.

:func:`run` is the whole of ``rag bench answers``: the corpus indexed, the
pipeline calibrated, every system asked.

Does not: grade with a model, or tune anything; the figures are for people.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

from engine.llama_cpp.snapshots import SnapshotCache

from ..qa.citations import Grounding
from ..qa.options import DEFAULT_CANDIDATES, DEFAULT_EVIDENCE
from ..qa.pipeline import Pipeline
from ..evaluation.grading import GoldQuestion, facts_found, load_gold, token_f1
from ..evaluation.stats import bootstrap_interval, mean, percentile
from . import setup
from .setup import Harness
from .peer import WARM_UP_QUESTION, LangChainRag

OURS = "rag-budget"
OURS_FREE = "rag-budget, no target"
OURS_TODAY = "rag-budget, today's prompt"  # at the target, the evidence found but not prompted (before issue 36)
PEER_K = 4
MAX_EVIDENCE_WORDS = 60  # longer evidence counts as wrong: a whole passage pasted in cannot score


def at_target(target: float) -> str:
    """The name of ours at a target other than the bench's own."""
    return f"rag-budget, {target:g} s"


def evidence_variant(place: str) -> str:
    """The name of ours at the target with the evidence placed ``place``."""
    return OURS_TODAY if place == "off" else f"rag-budget, evidence {place}"


def _ours(pipeline: Pipeline, question: str, max_tokens: int, target: float | None, **options) -> dict[str, object]:
    extra = {"target_ttft": target} if target is not None else {"no_target": True}
    answer = pipeline.ask(question, max_tokens=max_tokens, **extra, **options)
    # The passages the prompt showed, as retrieved (the same search, its query vector cached).
    texts = {h.chunk_id: h.text for h in pipeline.search(question, k=options.get("candidates", DEFAULT_CANDIDATES))}
    return {"ttft_s": answer.timings.ttft_s, "prompt_tokens": answer.timings.prompt_tokens,
            "cached_tokens": answer.timings.cached_tokens,
            "sources": [s.source for s in answer.sources], "answer": answer.answer,
            "invented": len(answer.ungrounded), "evidence": [e.to_dict() for e in answer.evidence],
            "declined": answer.declined, "evidence_s": answer.budget.evidence_s,
            "passages_text": "\n\n".join(texts.get(s.chunk_id, "") for s in answer.sources)}


class OwnStores:
    """Each of our systems with a passage store of its own (RAM only),
    swapped in for its turn; ``close`` puts the engine's own back."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.store = getattr(backend, "passages", None) if hasattr(backend, "forget_prompts") else None
        self.kept: dict[str, tuple] = {}
        self.current: str | None = None

    def turn(self, name: str) -> None:
        """Make ``name``'s store the engine's, with no prompt of the turn before held by an idle sequence."""
        if self.store is None:
            return
        self.backend.forget_prompts()
        if name == self.current:
            return
        mine = self.kept.pop(name, None) or (SnapshotCache(self.store.cache.max_bytes, None, 0), None)
        self.kept[self.current or ""] = self.store.start_over(*mine)
        self.current = name

    def close(self) -> None:
        """Put back the store the engine had before the first turn."""
        if self.store is not None and "" in self.kept:
            self.store.start_over(*self.kept.pop(""))
            self.current = None


def _theirs(peer: LangChainRag, question: str) -> dict[str, object]:
    result = peer.answer(question, PEER_K)
    # Its prompt numbers nothing: every [n] it writes is invented; files are checked as ours are.
    check = Grounding(0, tuple(result["sources"]))
    result["invented"] = len(check.clean(str(result["answer"]))[1])
    return result


def bench_answers(
    pipeline: Pipeline,
    questions: Sequence[GoldQuestion],
    *,
    target_ttft: float,
    max_tokens: int = 64,
    peer: bool = True,
    also_targets: Sequence[float] = (),
    evidence_places: Sequence[str] = ("off",),
    free: bool = True,
    options: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Answer every question with each system, taking turns; score each
    answer; per system accuracy, median and p95 TTFT with bootstrap 95 %
    intervals, mean token F1, mean passages, prompt recall, invented
    citations, and how often the evidence alone (at most 60 words) and the
    prompt's passages state the key facts; then ours at the target against
    the others, paired. ``also_targets`` adds ours at each of those targets;
    ``evidence_places`` ours at the target with the evidence placed
    otherwise (``off``: today's prompt, the evidence not prompted); ``free``
    ours with no target."""
    options = options or {}
    extra = {at_target(t): t for t in also_targets if t != target_ttft}
    variants = {evidence_variant(p): p for p in evidence_places if p != options.get("evidence", DEFAULT_EVIDENCE)}
    pipeline.cost_model  # calibrated, if needed, before anything is timed
    pipeline.warm_up()
    systems = ([OURS, *variants, *extra] + ([OURS_FREE] if free else [])
               + ([f"langchain k={PEER_K}"] if peer else []))
    theirs = LangChainRag(pipeline, max_tokens=max_tokens, progress=notice) if peer else None
    # One untimed question each, not one of the set: model pages and the system prefix warm for all.
    _ours(pipeline, WARM_UP_QUESTION, max_tokens, target_ttft, **options)
    if theirs is not None:
        theirs.answer(WARM_UP_QUESTION, PEER_K)
    rows: list[dict[str, object]] = []
    total, done = len(questions) * len(systems), 0
    stores = OwnStores(pipeline.backend)
    try:
        for number, q in enumerate(questions, 1):
            for name in systems:
                if name == OURS or name == OURS_FREE or name in extra or name in variants:
                    stores.turn(name)
                    target = target_ttft if name == OURS or name in variants else extra.get(name)
                    mine = options | ({"evidence": variants[name]} if name in variants else {})
                    result = _ours(pipeline, q.question, max_tokens, target, **mine)
                else:
                    result = _theirs(theirs, q.question)
                rows.append(_row(name, number, q, result))
                done += 1
                if progress:
                    progress(done, total)
    finally:
        stores.close()
    summary_rows = [_summary_row(name, [r for r in rows if r["system"] == name]) for name in systems]
    return {
        "bench": "answers",
        "config": {
            "questions": len(questions), "max_tokens": max_tokens, "target_ttft_s": target_ttft,
            "also_targets_s": sorted(extra.values()), "peer_k": PEER_K if peer else None,
            "evidence": options.get("evidence", DEFAULT_EVIDENCE), "evidence_variants": list(variants.values()),
            "evidence_max_words": MAX_EVIDENCE_WORDS,
            "retrieval": pipeline.retrieval, "index": str(pipeline.index_location),
            "model": str(pipeline.backend.describe().get("model_path", pipeline.backend.name)),
            "options": options, "interval": "bootstrap 95 % over questions, 2,000 resamples, seed 0",
        },
        "rows": rows,
        "summary": {"systems": summary_rows, **_versus(rows, systems)},
    }


def _row(system: str, number: int, q: GoldQuestion, result: dict[str, object]) -> dict[str, object]:
    """One answer's row: right or not, which facts, F1, time, prompt."""
    answer = str(result["answer"]).strip()
    found = facts_found(answer, q.facts)
    evidence = list(result.get("evidence") or ())
    quoted = " ".join(f"{e.get('about', '')} {e['text']}" for e in evidence)
    words = len(quoted.split())
    passages = result.get("passages_text")
    return {
        "system": system, "question": number, "right": all(found), "facts_found": sum(found),
        "facts": len(found), "f1": round(token_f1(answer, q.reference), 4) if q.reference else None,
        "ttft_s": round(float(result["ttft_s"]), 4), "prompt_tokens": result["prompt_tokens"],
        "cached_tokens": result.get("cached_tokens", 0),
        "chunks": len(result["sources"]), "prompt_has_gold": any(s in q.gold for s in result["sources"]),
        "invented_citations": int(result["invented"]), "answer": answer[:400],
        # The evidence alone: right only within the word limit, so a passage pasted whole cannot score.
        "evidence_right": bool(evidence) and words <= MAX_EVIDENCE_WORDS and all(facts_found(quoted, q.facts))
        if "evidence" in result else None,
        "evidence_words": words, "evidence": quoted[:600],
        "prompt_states_facts": all(facts_found(passages, q.facts)) if passages is not None else None,
        "declined": bool(result.get("declined", False)), "evidence_s": result.get("evidence_s"),
    }


def _summary_row(name: str, mine: Sequence[dict[str, object]]) -> dict[str, object]:
    """A system's accuracy and median TTFT with their intervals, and its means."""
    right = [1.0 if r["right"] else 0.0 for r in mine]
    ttfts = [float(r["ttft_s"]) for r in mine]
    f1s = [r["f1"] for r in mine if r["f1"] is not None]
    judged = [r for r in mine if r.get("evidence_right") is not None]
    evidence_right = [1.0 if r["evidence_right"] else 0.0 for r in judged]
    ceiling = [r for r in mine if r.get("prompt_states_facts") is not None]
    return {
        "name": name, "questions": len(mine), "right": int(sum(right)),
        "accuracy": round(mean(right), 3), "accuracy_ci95": bootstrap_interval(right, mean),
        "median_ttft_s": percentile(ttfts, 0.5), "median_ttft_ci95": bootstrap_interval(ttfts, lambda v: percentile(v, 0.5)),
        "p95_ttft_s": percentile(ttfts, 0.95), "p95_ttft_ci95": bootstrap_interval(ttfts, lambda v: percentile(v, 0.95)),
        "evidence_right": int(sum(evidence_right)) if judged else None,
        "evidence_right_ci95": bootstrap_interval(evidence_right, mean) if judged else None,
        "prompt_states_facts": sum(1 for r in ceiling if r["prompt_states_facts"]) if ceiling else None,
        "declined": sum(1 for r in mine if r.get("declined")),
        "mean_evidence_s": round(mean(float(r["evidence_s"]) for r in judged if r.get("evidence_s") is not None), 4)
        if judged else None,
        "mean_f1": round(mean(f1s), 3) if f1s else None,
        "mean_chunks": round(mean(r["chunks"] for r in mine), 2),
        "prompt_recall": round(mean(1.0 if r["prompt_has_gold"] else 0.0 for r in mine), 3),
        "invented_citations": sum(int(r["invented_citations"]) for r in mine),
    }


def _versus(rows: Sequence[dict[str, object]], systems: Sequence[str]) -> dict[str, object]:
    """Ours at the target against each other system, question by question:
    answers right that the other got wrong and the reverse, and the ratio
    of their median TTFT to ours."""
    by = {(r["system"], r["question"]): r for r in rows}
    numbers = sorted({r["question"] for r in rows})
    out: dict[str, object] = {}
    ours_ttft = percentile([float(by[(OURS, n)]["ttft_s"]) for n in numbers], 0.5)
    for other in systems[1:]:
        key = other.replace("rag-budget, ", "").replace(" ", "_").replace("=", "").replace(".", "_").replace("'", "")
        ours_right = [bool(by[(OURS, n)]["right"]) for n in numbers]
        theirs_right = [bool(by[(other, n)]["right"]) for n in numbers]
        only_ours = sum(1 for a, b in zip(ours_right, theirs_right) if a and not b)
        only_theirs = sum(1 for a, b in zip(ours_right, theirs_right) if b and not a)
        differences = [float(a) - float(b) for a, b in zip(ours_right, theirs_right)]
        out[f"vs_{key}"] = {
            "only_ours_right": only_ours, "only_theirs_right": only_theirs,
            "sign_test_p": sign_test(only_ours, only_theirs),
            "accuracy_difference": round(mean(differences), 3),
            "accuracy_difference_ci95": bootstrap_interval(differences, mean),
            "ttft_ratio": round(percentile([float(by[(other, n)]["ttft_s"]) for n in numbers], 0.5) / ours_ttft, 2)
            if ours_ttft else None,
        }
    return out


def sign_test(wins: int, losses: int) -> float:
    """The two-sided exact sign test's p-value for ``wins`` against
    ``losses`` (ties left out): how likely a split at least this uneven is
    if either way were as likely.

    ``sign_test(6, 0) -> 0.031``
    """
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(0, min(wins, losses) + 1)) / 2 ** n
    return round(min(1.0, 2 * tail), 3)



def questions_and_pipeline(h: Harness, corpus: Path, include: Sequence[str], questions: Optional[Path], limit: int,
          target_ttft: float | None, index: Optional[Path], model: Optional[Path],
          ) -> tuple[list[GoldQuestion], float, Pipeline]:
    """What ``rag bench answers`` (and ``--evidence-only``) asks: the first
    ``limit`` (0: all) questions of ``questions`` (default: the bundled
    Python-docs answer set), the target (default: the settings', else 2 s)
    and a calibrated pipeline over ``corpus``, indexed, that keeps no KV
    snapshot on disk."""
    qs = load_gold(questions or setup.BENCH_DATA / "python_docs_answers.jsonl")
    qs = qs[:limit] if limit else qs
    target = target_ttft or h.settings(model=model).target_ttft or 2.0
    pipeline = setup.bench_pipeline(h, corpus, include, index, model, kv_dir=False)
    pipeline.prepare()  # calibrate, if needed, before anything is timed
    return qs, target, pipeline


def run(h: Harness, corpus: Path, include: Sequence[str], *, questions: Optional[Path] = None, limit: int = 0,
        target_ttft: float | None = None, max_tokens: int = 64, peer: bool = True, also_targets: Sequence[float] = (),
        evidence_places: Sequence[str] = ("off",), free: bool = True, options: dict | None = None,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench answers``: the questions of :func:`questions_and_pipeline` answered by
    every system and scored (:func:`bench_answers`); ``options`` are ours'
    evidence options (``evidence``, ``evidence_embed``, ``evidence_floor``)."""
    qs, target, pipeline = questions_and_pipeline(h, corpus, include, questions, limit, target_ttft, index, model)
    with h.counting("answers") as update:
        return bench_answers(pipeline, qs, target_ttft=target, max_tokens=max_tokens, peer=peer,
                             also_targets=also_targets, evidence_places=evidence_places, free=free, options=options,
                             progress=update, notice=h.notice)


def main() -> None:
    """``python -m rag.bench.answers``: ``rag bench answers`` on its own."""
    setup.command_alone("answers")


if __name__ == "__main__":
    main()
