"""The index on disk: generations of FAISS vectors (``vectors``), BM25
(``lexical``) and SQLite metadata (``store``), published atomically."""

from .store import FileRecord, Hit, Index, IndexWriter, Manifest, NewChunk, index_exists, live_manifest, open_writer

__all__ = ["FileRecord", "Hit", "Index", "IndexWriter", "Manifest", "NewChunk", "index_exists", "live_manifest",
           "open_writer"]
