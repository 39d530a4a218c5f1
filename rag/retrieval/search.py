"""Candidate chunks for a question: dense, lexical (BM25) or both fused.

A :class:`~rag.retrieval.scope.Scope` restricts every mode to the chunks of
the documents in it, inside each search, so the ``k`` returned are the best
in scope rather than what is left of the best overall. A question's
collection is given to each search by name: the store keeps to its chunks,
and BM25 ranks by its statistics alone, so a ranking in one collection is the
same whatever another holds.

``hybrid`` runs both searches and fuses their rankings by reciprocal rank
(Cormack et al., 2009): a chunk's fused score is the sum over the rankings
of ``1 / (RRF_K + rank)``. Ranks, not scores, are fused, because cosine and
BM25 scores are on unrelated scales. Every hit keeps its cosine similarity
as ``score``, whichever search found it, so the budgeter's relevance floor
means the same in every mode.

Does not: embed documents, or decide how many chunks reach the prompt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Literal, Sequence

import numpy as np

from ..errors import CollectionNotFound, RagError
from ..index.collection_names import DEFAULT_COLLECTION, missing_collection
from ..index.interface import IndexReader
from ..index.records import Hit
from .scope import Scope

RetrievalMode = Literal["dense", "bm25", "hybrid"]
MODES: tuple[str, ...] = ("dense", "bm25", "hybrid")
# Chosen by `rag bench retrieval` on the Python docs (README, "Retrieval").
DEFAULT_MODE: RetrievalMode = "hybrid"
RRF_K = 5  # measured best of 5, 20, 60 (the paper's) on the Python docs; README
FUSION_DEPTH = 50  # each ranking contributes its first max(k, FUSION_DEPTH)


def check_mode(mode: str) -> RetrievalMode:
    """``mode`` if it is a retrieval mode, else a RagError naming them."""
    if mode not in MODES:
        raise RagError(f"retrieval mode {mode!r}: use one of {', '.join(MODES)}")
    return mode  # type: ignore[return-value]


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Items of all ``rankings`` (each best first) with their fused score
    ``sum(1 / (k + rank))``, best first; ties keep first-seen order.

    ``reciprocal_rank_fusion([[7, 3], [3, 9]])[0][0] == 3``
    """
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(fused.items(), key=lambda kv: -kv[1])


class QueryCache:
    """The last ``size`` query vectors, by collection and query text: a
    repeated question (a retry, a benchmark, a chat's `/sources`) is not
    embedded again. Kept per collection, so how fast a question is embedded
    tells nothing of what was asked in another collection."""

    def __init__(self, embed: Callable[[Sequence[str]], np.ndarray], size: int = 1024) -> None:
        self._embed = embed
        self._size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def vector(self, query: str, collection: str = DEFAULT_COLLECTION) -> np.ndarray:
        """The unit vector of ``query``, from the cache when it was asked in ``collection``."""
        key = (collection, query)
        with self._lock:
            found = self._vectors.get(key)
            if found is not None:
                self._vectors.move_to_end(key)
                self.hits += 1
                return found
        vector = self._embed([query])[0]
        vector.setflags(write=False)
        with self._lock:
            self.misses += 1
            self._vectors[key] = vector
            while len(self._vectors) > self._size:
                self._vectors.popitem(last=False)
        return vector


class ScopeMatchesNothing(RagError):
    """No document in the index is in the scope a question asked for."""


def scoped_ids(index: IndexReader, scope: Scope | None, collection: str = DEFAULT_COLLECTION) -> np.ndarray | None:
    """The chunk ids in ``scope`` within ``collection`` (None: the whole
    collection, which each search is given by name and keeps to); a
    ScopeMatchesNothing error when no indexed document of the collection is
    in it, CollectionNotFound when the collection holds none.

    The collection's filter is never dropped here on the reader's list of
    collections: the store applies it. A folder generation holding that
    collection alone needs none (it never changes while open); PostgreSQL's
    rows are live, a first commit to another collection could come between
    reading the list and searching, so it filters in the SQL itself, at a
    cost measured small: the only collection's vector search keeps HNSW (a
    collection among others, or a scope, is searched exactly, as before),
    and BM25 looks a posting's chunk up only where another collection exists."""
    if scope is None or scope.everything:
        if not index.collections().get(collection):
            raise CollectionNotFound(missing_collection(collection))
        return None
    allowed = index.chunk_ids_of(scope.allows, scope, collection)
    if len(allowed) == 0:
        n = len(index.files(collection=collection))
        if n == 0:
            raise CollectionNotFound(missing_collection(collection))
        raise ScopeMatchesNothing(
            f"no document in the index matches {scope.describe()} ({n} document{'s' if n != 1 else ''} indexed; "
            "globs match a source's path relative to the folder ingested, or its name)"
        )
    return allowed


def retrieve(
    index: IndexReader, query: str, vector: Callable[[], np.ndarray], k: int, mode: RetrievalMode, *, rrf_k: int = RRF_K,
    scope: Scope | None = None, collection: str = DEFAULT_COLLECTION,
) -> list[Hit]:
    """The ``k`` best chunks of ``index`` for ``query`` under ``mode``,
    only from the documents of ``collection`` in ``scope`` (None: all); ``vector()`` gives the
    query's unit vector when a mode needs it. ScopeMatchesNothing when no
    document is in the scope."""
    allowed = scoped_ids(index, scope, collection)
    if mode == "dense":
        return index.search(vector(), k, allowed, collection=collection)
    if mode == "bm25":
        found = index.lexical_search(query, k, allowed, collection=collection)
        return index.hits([i for i, _ in found], vector()) if found else []
    depth = max(k, FUSION_DEPTH)
    q = vector()
    dense = index.search_ids(q, depth, allowed, collection=collection)
    lexical = index.lexical_search(query, depth, allowed, collection=collection)
    fused = reciprocal_rank_fusion([[i for i, _ in dense], [i for i, _ in lexical]], k=rrf_k)[:k]
    return index.hits([i for i, _ in fused], q, known=dict(dense))
