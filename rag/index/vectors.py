"""Which FAISS index holds the vectors, and how it is searched.

Small indexes are searched exactly (``IndexFlatIP`` behind an id map). At
``APPROXIMATE_FROM`` vectors and above, a commit rebuilds the vectors into
an inverted-file index (``IndexIVFFlat``, ``nlist ≈ √n`` lists, ``NPROBE``
of them searched): `rag bench search` measured where exact search becomes
slow enough to trade a little recall for speed, and which ``nprobe`` keeps
recall@10 high (README, "Search that scales"). HNSW measured well too, but
FAISS cannot remove vectors from it, and re-ingest removes the chunks of
changed files; IVF can, with a hash-table direct map that also lets a
chunk's vector be read back by id.

Does not: know about chunks, SQLite or files.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# Chosen by `rag bench search` (README): see the module docstring.
APPROXIMATE_FROM = 50_000  # exact search passes 10 ms p50 at about 48,000 vectors here
NPROBE = 16
TRAIN_PER_LIST = 64  # training points per inverted list: FAISS warns below 39


def new_vectors(dim: int):
    """An empty exact index for unit vectors of ``dim``, with chunk ids."""
    import faiss

    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def is_approximate(index) -> bool:
    """Whether ``index`` is an inverted-file (approximate) index."""
    import faiss

    return isinstance(index, faiss.IndexIVF)


def nlist_for(n: int) -> int:
    """The number of inverted lists for ``n`` vectors."""
    return max(1, int(math.sqrt(n)))


def fit_vectors(index, dim: int, ids: Sequence[int], *, approximate_from: int | None = None):
    """``index``, or its vectors moved to the index type that suits their
    number: exact below ``approximate_from`` (default ``APPROXIMATE_FROM``),
    IVF from there, retrained once the count has grown fourfold since
    training. ``ids`` are all the chunk ids it holds."""
    threshold = APPROXIMATE_FROM if approximate_from is None else approximate_from
    n = int(index.ntotal)
    if is_approximate(index):
        if n < threshold // 2:  # hysteresis: no flapping around the threshold
            return _rebuild_exact(index, dim, ids)
        if index.nlist * 2 < nlist_for(n):
            return _rebuild_ivf(index, dim, ids)
        return index
    if n >= threshold:
        return _rebuild_ivf(index, dim, ids)
    return index


def vector_search(index, queries: np.ndarray, k: int, nprobe: int = NPROBE,
                  allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's ``(scores, ids)`` for ``queries``, searching ``nprobe``
    lists of an IVF index; with ``allowed`` ids, among those only, and
    exactly (every IVF list is searched: a narrow scope may have no vector
    in the lists nearest the query)."""
    import faiss

    selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64)) if allowed is not None else None
    if is_approximate(index):
        probe = index.nlist if selector is not None else min(nprobe, index.nlist)
        return index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=probe, sel=selector))
    if selector is not None:
        return index.search(queries, k, params=faiss.SearchParameters(sel=selector))
    return index.search(queries, k)


def describe(index) -> str:
    """What ``rag doctor`` says of the vector search."""
    if is_approximate(index):
        return (
            f"approximate: IVF, {index.nlist} lists, {min(NPROBE, index.nlist)} searched "
            f"(from {APPROXIMATE_FROM:,} vectors)"
        )
    return f"exact: flat inner product (approximate IVF from {APPROXIMATE_FROM:,} vectors)"


def _all_vectors(index, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    ids_arr = np.asarray(ids, dtype=np.int64)
    if len(ids_arr) != index.ntotal:
        raise ValueError(f"{len(ids_arr)} chunk ids for {index.ntotal} vectors")
    if len(ids_arr) == 0:
        return np.zeros((0, index.d), dtype=np.float32), ids_arr
    return np.vstack([index.reconstruct(int(i)) for i in ids_arr]).astype(np.float32), ids_arr


def _rebuild_exact(index, dim: int, ids: Sequence[int]):
    vectors, ids_arr = _all_vectors(index, ids)
    exact = new_vectors(dim)
    exact.add_with_ids(vectors, ids_arr)
    return exact


def new_ivf(dim: int, nlist: int):
    """An untrained IVF index of ``nlist`` lists for unit vectors of ``dim``,
    whose vectors can be removed and read back by id."""
    import faiss

    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)  # remove_ids and reconstruct by chunk id
    return ivf


def build_ivf(vectors: np.ndarray, ids: np.ndarray, nlist: int, *, seed: int = 0):
    """An IVF index of ``vectors`` (unit rows) under ``ids``, trained on at
    most ``TRAIN_PER_LIST`` points a list."""
    ivf = new_ivf(vectors.shape[1], nlist)
    rng = np.random.default_rng(seed)
    sample = vectors if len(vectors) <= nlist * TRAIN_PER_LIST else vectors[
        rng.choice(len(vectors), nlist * TRAIN_PER_LIST, replace=False)
    ]
    ivf.train(np.ascontiguousarray(sample))
    ivf.add_with_ids(np.ascontiguousarray(vectors), ids)
    return ivf


def _rebuild_ivf(index, dim: int, ids: Sequence[int]):
    vectors, ids_arr = _all_vectors(index, ids)
    return build_ivf(vectors, ids_arr, nlist_for(len(ids_arr)))
