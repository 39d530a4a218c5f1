"""Finding candidate chunks for a question: dense, BM25 or both fused
(``search``), with a cache of query vectors."""

from .search import DEFAULT_MODE, MODES, RRF_K, QueryCache, RetrievalMode, check_mode, reciprocal_rank_fusion, retrieve

__all__ = ["DEFAULT_MODE", "MODES", "RRF_K", "QueryCache", "RetrievalMode", "check_mode", "reciprocal_rank_fusion",
           "retrieve"]
