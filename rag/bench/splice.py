"""``rag bench splice``: how far a prompt whose passages are spliced from
the passage KV store is from a full prefill of the same prompt, for each R
(the tokens at the head of each spliced passage evaluated again), and what
it saves in time to first token.

For every question the pipeline plans its prompt as it would answer it
(retrieval, budget at the target; planned with splicing off, so the prompt
does not depend on what earlier questions stored), its passages are stored,
and then, each run starting from the system prompt alone (no idle sequence
holds any of it):

* the full prefill answers greedily (the engine's own decoding: greedy with
  its repeat penalty), ``n`` <= 32 tokens (an end token counts as one);
  its TTFT is the cold one (no passage stored: a full prefill);
* the full prefill is teacher-forced on that answer: the model's raw
  next-token logits at each of its ``n`` positions;
* for each R, the spliced prompt answers greedily (TTFT warm) and is
  teacher-forced on the full prefill's answer.

Agreement (what decides the default R) is position-wise: the share of the
``n`` positions where the spliced answer's token equals the full prefill's
(a shorter spliced answer disagrees at every position it lacks). Prefix
agreement is the share before the first difference. KL is
KL(full || spliced) of the next-token distributions (softmax of the raw
logits, no penalty), averaged over the ``n`` positions of a question, then
over questions (:mod:`rag.evaluation.agreement` computes both, and the
summary per R).

:func:`run` is the whole of ``rag bench splice``: the corpus indexed, then
every question measured.

Does not: decide anything by itself: ``summary.default_r`` is the smallest R
whose mean agreement is at least 0.95 while it still splices and saves time
(None if none does), for people to set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from engine.llama_cpp.passage_kv import find_spans
from engine.llama_cpp.requests import Trace

from ..errors import RagError
from ..evaluation.agreement import AGREEMENT, agreement, kl_divergence, splice_summary
from ..evaluation.questions import Question
from ..evaluation.stats import mean
from ..qa.pipeline import Pipeline
from . import setup
from .setup import Harness

FRESH = (0, 4, 16, 32)
ANSWER_TOKENS = 32


class _Runner:
    """One engine's runs of one prompt, each from the system prompt alone."""

    def __init__(self, backend, tokens: list[int], passages: Sequence[str], answer_tokens: int) -> None:
        self.backend, self.tokens, self.passages, self.answer_tokens = backend, tokens, tuple(passages), answer_tokens

    def run(self, fresh: int | None, forced: Sequence[int] = ()):
        """A traced greedy (or teacher-forced) answer with splicing at
        ``fresh`` (None: a full prefill); the trace and the timings."""
        self.backend.passages.use(fresh=fresh, exact=False)
        self.backend.forget_prompts()  # no idle sequence may hold this prompt from the run before
        trace = Trace(forced=tuple(forced))
        n = len(forced) or self.answer_tokens
        _, timings = self.backend.generate(self.tokens, max_tokens=n, trace=trace,
                                           passages=self.passages if fresh is not None else ()).result()
        return trace, timings


def _question_rows(pipeline: Pipeline, number: int, question: str, fresh: Sequence[int], target: float | None,
                   answer_tokens: int) -> list[dict[str, object]]:
    """The rows of one question: its full prefill and one per R."""
    backend = pipeline.backend
    backend.passages.use(fresh=None, exact=False)  # planned without reuse: the prompt is the same whatever is stored
    prompt = pipeline.planned(question, target_ttft=target, no_target=target is None, max_tokens=answer_tokens)
    tokens = backend.tokenize(prompt.text)
    found = [s for s in find_spans(tokens, [backend.tokenize(p) for p in prompt.passages]) if s is not None]
    backend.precompute_passages(prompt.passages)
    runner = _Runner(backend, tokens, prompt.passages, answer_tokens)
    full, cold = runner.run(None)
    full_forced, _ = runner.run(None, forced=full.tokens)
    rows = []
    for r in fresh:
        greedy, warm = runner.run(r)
        forced, _ = runner.run(r, forced=full.tokens)
        agree, prefix = agreement(full.tokens, greedy.tokens)
        kl = [kl_divergence(p, q) for p, q in zip(full_forced.logits, forced.logits)]
        rows.append({
            "question": number, "fresh": r, "prompt_tokens": len(tokens), "passages": len(prompt.passages),
            "passages_found": len(found), "answer_tokens": len(full.tokens), "agreement": round(agree, 4),
            "prefix_agreement": round(prefix, 4), "kl": round(mean(kl), 5), "kl_max": round(max(kl, default=0.0), 5),
            "spliced_tokens": warm.spliced_tokens, "ttft_cold_s": round(cold.ttft_s, 4),
            "ttft_warm_s": round(warm.ttft_s, 4), "splice_s": round(warm.splice_s, 4),
            "timings_hold": warm.cached_tokens + warm.prefill_tokens == warm.prompt_tokens,
        })
    return rows


def bench_splice(
    pipeline: Pipeline,
    questions: Sequence[Question],
    *,
    fresh: Sequence[int] = FRESH,
    answer_tokens: int = ANSWER_TOKENS,
    target_ttft: float | None = 2.0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """For every question and R in ``fresh``: agreement and KL of the
    spliced prompt against its full prefill, and TTFT cold and warm (see the
    module). RagError for an engine that does not splice in process."""
    backend = pipeline.backend
    if not hasattr(backend, "passages") or not hasattr(backend, "forget_prompts"):
        raise RagError(f"rag bench splice needs the in-process llama.cpp engine, not {backend.name}")
    pipeline.prepare()
    before = backend.passages.fresh, backend.passages.exact
    rows: list[dict[str, object]] = []
    try:
        for number, q in enumerate(questions, start=1):
            rows += _question_rows(pipeline, number, q.question, fresh, target_ttft, answer_tokens)
            if progress:
                progress(number, len(questions))
    finally:
        backend.passages.use(fresh=before[0], exact=before[1])
    return {
        "bench": "splice",
        "config": {"fresh": list(fresh), "questions": len(questions), "answer_tokens": answer_tokens,
                   "target_ttft": target_ttft, "agreement_needed": AGREEMENT, "engine": backend.name,
                   "kv_type": getattr(backend, "kv_type", None), "index": str(pipeline.index_location)},
        "rows": rows,
        "summary": splice_summary(rows, fresh),
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, questions: Optional[Path] = None, limit: int = 0,
        fresh: Sequence[int] = FRESH, answer_tokens: int = ANSWER_TOKENS, target_ttft: float = 2.0,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench splice``: ``corpus`` indexed, then the first ``limit``
    (0: all) questions of ``questions`` (default: the bundled Python-docs
    dev set) measured at each R of ``fresh`` (:func:`bench_splice`); no
    stored passage is left behind on disk."""
    qs = setup.questions_of(questions or setup.BENCH_DATA / "python_docs_dev.jsonl")
    qs = qs[:limit] if limit else qs
    pipeline = setup.bench_pipeline(h, corpus, include, index, model, kv_dir=False)
    with h.counting("questions") as update:
        return bench_splice(pipeline, qs, fresh=fresh, answer_tokens=answer_tokens, target_ttft=target_ttft,
                            progress=update)


def main() -> None:
    """``python -m rag.bench.splice``: ``rag bench splice`` on its own."""
    setup.command_alone("splice")


if __name__ == "__main__":
    main()
