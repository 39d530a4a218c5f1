"""``rag bench search``: vector search latency and recall as the index grows.

Synthetic unit vectors of the embedding's dimension stand in for chunks.
They are clustered (points scattered around random centres, as sentence
embeddings of a corpus cluster by topic); uniformly random vectors would
have no neighbourhoods for an approximate index to find. Vectors are made in
batches from per-batch seeds, so a size is generated again rather than kept
in a second copy: memory holds the exact index and the one being measured.

Every index answers the same queries one at a time (as the store searches),
and its top 10 is compared with exact search's. With ``store`` (a
``postgresql://`` URL of a database with pgvector, emptied and filled), the
same vectors go into the PostgreSQL index store too and its own search is
measured, exact and through HNSW (``rag.index.postgres``).

:func:`run` is the whole of ``rag bench search``.

Does not: touch a real index; see ``rag.vectors`` for what the store uses.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import numpy as np

from prompt_budget.recent import quantile

from ..errors import redacted
# APPROXIMATE_FROM: the store's switch to IVF, printed beside the figures.
from ..index.vectors import APPROXIMATE_FROM, NPROBE, TRAIN_PER_LIST, new_ivf, nlist_for  # noqa: F401
from . import setup
from .setup import Harness

BATCH = 50_000
QUERIES = 200
TOP = 10
FAST_ENOUGH_MS = 10.0  # p50 search time at which exact search is traded for IVF


def _centres(dim: int, seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0])
    count = max(16, n // 2_000)
    c = rng.normal(size=(count, dim)).astype(np.float32)
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def synthetic_batches(n: int, dim: int, seed: int = 0, spread: float = 1.4) -> Iterator[np.ndarray]:
    """``n`` clustered unit vectors of ``dim``, in batches of at most
    ``BATCH``; the same arguments give the same vectors."""
    centres = _centres(dim, seed, n)
    for number, start in enumerate(range(0, n, BATCH), start=1):
        rng = np.random.default_rng([seed, number])
        size = min(BATCH, n - start)
        # Noise of norm ~spread around unit centres: a point's cosine to its
        # centre is ~0.6, to a neighbour from its cluster ~0.35.
        x = centres[rng.integers(0, len(centres), size)] + spread / np.sqrt(dim) * rng.normal(size=(size, dim)).astype(np.float32)
        yield (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _head(batches: Iterator[np.ndarray], count: int) -> Iterator[np.ndarray]:
    for batch in batches:
        if count <= 0:
            return
        yield batch[:count]
        count -= len(batch)


def _queries(n: int, dim: int, seed: int) -> np.ndarray:
    # Fresh points of the same clusters (the centres depend on n and seed only).
    centres = _centres(dim, seed, n)
    rng = np.random.default_rng([seed, 10**9])
    x = centres[rng.integers(0, len(centres), QUERIES)] + 1.4 / np.sqrt(dim) * rng.normal(size=(QUERIES, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _timed_search(index, queries: np.ndarray, search_params=None) -> tuple[np.ndarray, list[float]]:
    found, times = [], []
    for q in queries:
        started = time.perf_counter()
        if search_params is not None:
            _, ids = index.search(q.reshape(1, -1), TOP, params=search_params)
        else:
            _, ids = index.search(q.reshape(1, -1), TOP)
        times.append(time.perf_counter() - started)
        found.append(ids[0])
    return np.vstack(found), times


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / TOP for f, t in zip(found, truth)]))


def _row(n: int, kind: str, params: str, build_s: float, times: list[float], recall: float, nbytes: int) -> dict:
    return {
        "vectors": n, "index": kind, "params": params, "build_s": round(build_s, 2),
        "p50_ms": round(quantile(times, 0.5) * 1000, 3), "p95_ms": round(quantile(times, 0.95) * 1000, 3),
        "p99_ms": round(quantile(times, 0.99) * 1000, 3),
        "recall@10": round(recall, 4), "bytes": nbytes,
    }


def bench_search(
    sizes: Sequence[int],
    dim: int,
    *,
    kinds: Sequence[str] = ("flat", "ivf", "hnsw"),
    nprobes: Sequence[int] = (4, NPROBE, 64),
    hnsw_max: int = 200_000,
    seed: int = 0,
    store: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """p50/p95/p99 single-query latency and recall@10 against exact search
    for each index kind at each size; HNSW is built only up to ``hnsw_max``
    vectors (its build is the slowest by far on few cores; the row says so).
    With ``store``, the PostgreSQL index at that URL is replaced and
    measured too (:func:`pgvector_rows`)."""
    import faiss

    say = progress or (lambda message: None)
    rows: list[dict[str, object]] = []
    for n in sizes:
        queries = _queries(n, dim, seed)
        say(f"{n:,} vectors: exact")
        started = time.perf_counter()
        flat = faiss.IndexFlatIP(dim)
        for batch in synthetic_batches(n, dim, seed):
            flat.add(batch)
        build = time.perf_counter() - started
        truth, times = _timed_search(flat, queries)
        if "flat" in kinds:
            rows.append(_row(n, "flat", "exact", build, times, 1.0, n * dim * 4))
        if "ivf" in kinds:
            nlist = nlist_for(n)
            say(f"{n:,} vectors: IVF, {nlist} lists")
            started = time.perf_counter()
            ivf = new_ivf(dim, nlist)
            # Batches are in random order: their head is a random sample.
            head = np.vstack(list(_head(synthetic_batches(n, dim, seed), nlist * TRAIN_PER_LIST)))
            ivf.train(head)
            del head
            offset = 0
            for batch in synthetic_batches(n, dim, seed):
                ivf.add_with_ids(batch, np.arange(offset, offset + len(batch), dtype=np.int64))
                offset += len(batch)
            build = time.perf_counter() - started
            for nprobe in nprobes:
                found, times = _timed_search(ivf, queries, faiss.SearchParametersIVF(nprobe=min(nprobe, nlist)))
                rows.append(_row(n, "ivf", f"nlist={nlist} nprobe={min(nprobe, nlist)}", build, times,
                                 _recall(found, truth), n * (dim * 4 + 8)))
            del ivf
        if "hnsw" in kinds:
            if n > hnsw_max:
                rows.append({"vectors": n, "index": "hnsw", "params": "M=32", "skipped":
                             f"build over {hnsw_max:,} vectors left out (--hnsw-max); see the build_s of smaller sizes"})
            else:
                say(f"{n:,} vectors: HNSW")
                started = time.perf_counter()
                hnsw = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
                for batch in synthetic_batches(n, dim, seed):
                    hnsw.add(batch)
                build = time.perf_counter() - started
                for ef in (32, 128):
                    found, times = _timed_search(hnsw, queries, faiss.SearchParametersHNSW(efSearch=ef))
                    rows.append(_row(n, "hnsw", f"M=32 efSearch={ef}", build, times, _recall(found, truth),
                                     n * (dim * 4 + 32 * 2 * 8)))
                del hnsw
        if store is not None:
            rows += pgvector_rows(store, n, dim, seed, queries, truth, say)
        del flat
    flat_rows = [r for r in rows if r["index"] == "flat"]
    # Exact search costs time in proportion to n: the size where its p50
    # reaches FAST_ENOUGH_MS, from the largest size measured.
    suggested = None
    if flat_rows:
        last = max(flat_rows, key=lambda r: r["vectors"])
        suggested = int(last["vectors"] * FAST_ENOUGH_MS / max(last["p50_ms"], 1e-6))
    return {
        "bench": "search",
        "config": {"sizes": list(sizes), "dim": dim, "kinds": list(kinds), "queries": QUERIES, "top": TOP,
                   "seed": seed, "threads": faiss.omp_get_max_threads(), "store": redacted(store) if store is not None else None},
        "rows": rows,
        "summary": {"suggested_approximate_from": suggested, "fast_enough_ms": FAST_ENOUGH_MS},
    }


def pgvector_rows(url: str, n: int, dim: int, seed: int, queries: np.ndarray, truth: np.ndarray,
                  say: Callable[[str], None]) -> list[dict[str, object]]:
    """The PostgreSQL store's own search (``PostgresIndex.search_ids``) over
    the ``n`` synthetic vectors, written through its writer into the
    database at ``url`` (replaced): exact (a sequential scan), then through
    an HNSW index at ef_search 40 (pgvector's default), 100 and 200 (and
    the store's ``HNSW_EF_SEARCH``); recall@10 against FAISS's exact ``truth``."""
    from ..index import postgres
    from ..index.manifest import Manifest
    from ..index.store import NewChunk

    say(f"{n:,} vectors: PostgreSQL, writing")
    started = time.perf_counter()
    manifest = Manifest("synthetic", dim, {"chunk_tokens": 0, "overlap_tokens": 0})
    with postgres.open_writer(url, manifest, fresh=True, approximate_from=n + 1) as writer:
        offset = 0
        for number, batch in enumerate(synthetic_batches(n, dim, seed)):
            chunks = [NewChunk(f"v{offset + i}", i, 0, 0, None, 0, "") for i in range(len(batch))]
            writer.add_file(root="/synthetic", source=f"batch{number}", path="/synthetic", sha256="", size=0,
                            chunks=chunks, vectors=batch)
            offset += len(batch)
        writer.commit()
    write_s = time.perf_counter() - started
    with postgres.connect(url) as db:
        db.execute("VACUUM ANALYZE rag_index.chunks")  # as autovacuum would, soon after a large ingest
        size = db.execute("SELECT pg_total_relation_size('rag_index.chunks')").fetchone()[0]
    rows = []
    index = postgres.PostgresIndex.open(url, embedder="synthetic", dim=dim)
    try:
        # Row i of the batches is chunk id i + 1: a fresh table's ids count from 1 in insertion order.
        found, times = _timed_store_search(index, queries)
        rows.append(_row(n, "pg-exact", "sequential scan", write_s, times, _recall(found - 1, truth), size))
    finally:
        index.close()
    say(f"{n:,} vectors: PostgreSQL, HNSW")
    started = time.perf_counter()
    with postgres.connect(url, autocommit=False) as db:
        search = postgres.fit_vector_search(db, n, approximate_from=0)
        postgres._put_meta(db, {"vector_search": search})
        db.commit()
    build_s = time.perf_counter() - started
    with postgres.connect(url) as db:
        size = db.execute("SELECT pg_total_relation_size('rag_index.chunks')").fetchone()[0]
    index = postgres.PostgresIndex.open(url, embedder="synthetic", dim=dim)
    try:
        for ef in sorted({40, 100, 200, postgres.HNSW_EF_SEARCH}):
            with index._access() as db:
                db.execute(f"SET hnsw.ef_search = {ef}")
            found, times = _timed_store_search(index, queries)
            rows.append(_row(n, "pg-hnsw", f"m={postgres.HNSW_M} ef_construction={postgres.HNSW_EF_CONSTRUCTION} "
                                           f"ef_search={ef}", build_s, times, _recall(found - 1, truth), size))
    finally:
        index.close()
    return rows


def _timed_store_search(index, queries: np.ndarray) -> tuple[np.ndarray, list[float]]:
    found, times = [], []
    for q in queries:
        started = time.perf_counter()
        ids = [i for i, _ in index.search_ids(q, TOP)]
        times.append(time.perf_counter() - started)
        found.append(ids + [-1] * (TOP - len(ids)))
    return np.asarray(found, dtype=np.int64), times


def run(h: Harness, sizes: Sequence[int], dim: int, *, kinds: Sequence[str] = ("flat", "ivf", "hnsw"),
        hnsw_max: int = 200_000, seed: int = 0, store: str | None = None) -> dict[str, object]:
    """``rag bench search``: :func:`bench_search`, its progress on the harness's status line."""
    with h.status("building") as update:
        return bench_search(sizes, dim, kinds=kinds, hnsw_max=hnsw_max, seed=seed, store=store, progress=update)


def main() -> None:
    """``python -m rag.bench.search``: ``rag bench search`` on its own."""
    setup.command_alone("search")


if __name__ == "__main__":
    main()
