"""The index on disk: generations (``generations``) of FAISS vectors
(``vectors``), BM25 (``lexical``) and SQLite metadata (``store``), each
described by its manifest (``manifest``) and published atomically.

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"index_exists": ".generations", "Manifest": ".manifest"} | {
    name: ".store" for name in ("FileRecord", "Hit", "Index", "IndexWriter", "NewChunk", "live_manifest", "open_writer")}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
