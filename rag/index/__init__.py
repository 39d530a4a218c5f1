"""The index: what a store must answer (``interface``), the records it
holds (``records``), and two stores chosen by the index's location
(``location``): on disk, generations (``generations``) of FAISS vectors
(``vectors``), BM25 (``lexical``) and SQLite metadata (``store``), each
described by its manifest (``manifest``) and published atomically; or one
PostgreSQL database (``postgres``).

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"index_exists": ".generations", "Manifest": ".manifest"} | {
    name: ".records" for name in ("FileRecord", "Hit", "NewChunk")} | {
    name: ".interface" for name in ("IndexReader", "IndexWriter", "IndexStore")} | {
    name: ".store" for name in ("FolderIndex", "FolderWriter", "live_manifest", "open_writer")}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
