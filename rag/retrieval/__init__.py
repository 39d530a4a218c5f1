"""Finding candidate chunks for a question: dense, BM25 or both fused
(``search``), within a scope of documents (``scope``), with a cache of query
vectors.

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"Scope": ".scope"} | {
    name: ".search" for name in ("DEFAULT_MODE", "MODES", "RRF_K", "QueryCache", "RetrievalMode",
                                 "ScopeMatchesNothing", "check_mode", "reciprocal_rank_fusion", "retrieve")}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
