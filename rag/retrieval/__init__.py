"""Finding candidate chunks for a question: dense, BM25 or both fused
(``search``), within a scope of documents (``scope``), with a cache of query
vectors."""

from .scope import Scope
from .search import (
    DEFAULT_MODE,
    MODES,
    RRF_K,
    QueryCache,
    RetrievalMode,
    ScopeMatchesNothing,
    check_mode,
    reciprocal_rank_fusion,
    retrieve,
)

__all__ = ["DEFAULT_MODE", "MODES", "RRF_K", "QueryCache", "RetrievalMode", "Scope", "ScopeMatchesNothing",
           "check_mode", "reciprocal_rank_fusion", "retrieve"]
