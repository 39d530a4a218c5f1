"""``rag bench retrieval``: recall@k and MRR of each retrieval mode, side by side.

Every mode answers the same questions from the same index in one run; the
query vectors are computed once (the query cache), so the latency columns
compare the searches themselves, and the embedding time is reported apart.
With ``store`` (a ``postgresql://`` URL of a database with pgvector), the
folder index is copied into the PostgreSQL index store there (its vectors as
they are: nothing embedded again) and every system runs on both, side by side.

:func:`run` is the whole of ``rag bench retrieval``: the corpus indexed,
then every question searched.

Does not: generate answers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from prompt_budget.recent import quantile

from ..evaluation.questions import Question, gold_ranks, metrics_from_ranks
from . import setup
from .setup import Harness
from ..qa.pipeline import Pipeline
from ..retrieval import DEFAULT_MODE, RRF_K, retrieve


def retrieval_systems(rrf_ks: Sequence[int] = (RRF_K,)) -> list[tuple[str, str, int]]:
    """``(name, mode, rrf_k)`` of the systems compared: dense, BM25, and
    hybrid at each RRF constant."""
    systems = [("dense", "dense", RRF_K), ("bm25", "bm25", RRF_K)]
    systems += [(f"hybrid rrf_k={k}", "hybrid", k) for k in rrf_ks]
    return systems


def bench_retrieval(
    pipeline: Pipeline,
    questions: Sequence[Question],
    ks: Sequence[int],
    *,
    rrf_ks: Sequence[int] = (RRF_K,),
    progress: Callable[[int, int], None] | None = None,
    index=None,
) -> dict[str, object]:
    """recall@k for each k and MRR of every system over ``questions``; the
    summary's top level is the pipeline's default retrieval. ``index``: an
    open index to search instead of the pipeline's (another store of the same chunks)."""
    index = index if index is not None else pipeline.index()
    cache = pipeline.components.query_cache
    embed_s = []
    for q in questions:  # cold: each question embedded once, timed
        started = time.perf_counter()
        cache.vector(q.question)
        embed_s.append(time.perf_counter() - started)
    index.lexical()  # loaded (or built) before any search is timed
    systems = retrieval_systems(rrf_ks)
    depth = max(ks)
    rows: list[dict[str, object]] = []
    results = []
    total, done = len(systems) * len(questions), 0
    for name, mode, rrf_k in systems:
        latencies: list[float] = []

        def search(question: str, k: int) -> list[str]:
            nonlocal done
            started = time.perf_counter()
            hits = retrieve(index, question, lambda: cache.vector(question), k, mode, rrf_k=rrf_k)  # type: ignore[arg-type]
            latencies.append(time.perf_counter() - started)
            done += 1
            if progress:
                progress(done, total)
            return [h.source for h in hits]

        ranks = gold_ranks(search, questions, depth)
        metrics = metrics_from_ranks(ranks, ks)
        rows += [{"system": name, "question": n, "rank": r} for n, r in enumerate(ranks, 1)]
        results.append(
            {
                "name": name, "mode": mode, "rrf_k": rrf_k if mode == "hybrid" else None,
                **{key: round(value, 4) for key, value in metrics.items()},
                "median_search_ms": round(quantile(latencies, 0.5) * 1000, 2),
                "p95_search_ms": round(quantile(latencies, 0.95) * 1000, 2),
            }
        )
    default_name = next(n for n, m, k in systems if m == pipeline.retrieval and (m != "hybrid" or k == RRF_K))
    default = next(r for r in results if r["name"] == default_name)
    summary: dict[str, object] = {key: default[key] for key in [f"recall@{k}" for k in ks] + ["mrr"]}
    summary |= {
        "default": default_name,
        "systems": results,
        "median_embed_ms": round(quantile(embed_s, 0.5) * 1000, 2),
        "depth": depth,
    }
    return {
        "bench": "retrieval",
        "config": {
            "questions": len(questions), "ks": list(ks), "rrf_ks": list(rrf_ks), "index": str(pipeline.index_location),
            "chunks": len(index), "default_mode": DEFAULT_MODE,
        },
        "rows": rows,
        "summary": summary,
    }


def run(h: Harness, corpus: Path, questions: Path, ks: Sequence[int], *, rrf_ks: Sequence[int] = (RRF_K,),
        index: Optional[Path] = None, include: Sequence[str] = (), store: Optional[str] = None) -> dict[str, object]:
    """``rag bench retrieval``: ``corpus`` indexed, then every question of
    ``questions`` searched by each system (:func:`bench_retrieval`); with
    ``store``, on the PostgreSQL copy of the index too, its figures under
    ``summary["pgvector"]`` (FAISS's stay where they were)."""
    qs = setup.questions_of(questions)
    pipeline = setup.bench_pipeline(h, corpus, include, index, None)
    with h.counting("searching") as update:
        result = bench_retrieval(pipeline, qs, ks, rrf_ks=rrf_ks, progress=update)
    if store is not None:
        from ..errors import redacted
        from ..index.postgres import PostgresIndex, copy_index

        folder = pipeline.index()
        with h.status("copying the index into PostgreSQL"):
            copy_index(folder, store)
        other = PostgresIndex.open(store, embedder=folder.manifest.embedder, dim=folder.manifest.dim)
        try:
            with h.counting("searching PostgreSQL") as update:
                copied = bench_retrieval(pipeline, qs, ks, rrf_ks=rrf_ks, progress=update, index=other)
            vector_search = other.stats()["vector_search"]
        finally:
            other.close()
        result["config"]["store"] = redacted(store)
        result["summary"]["pgvector"] = {key: copied["summary"][key] for key in
                                         [f"recall@{k}" for k in ks] + ["mrr", "default", "systems"]}
        result["summary"]["pgvector"]["vector_search"] = vector_search
        result["rows"] += [{**row, "store": "pgvector"} for row in copied["rows"]]
    return result


def main() -> None:
    """``python -m rag.bench.retrieval``: ``rag bench retrieval`` on its own."""
    setup.command_alone("retrieval")


if __name__ == "__main__":
    main()
