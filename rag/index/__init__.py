"""The index on disk: generations (``generations``) of FAISS vectors
(``vectors``), BM25 (``lexical``) and SQLite metadata (``store``), each
described by its manifest (``manifest``) and published atomically."""

from .generations import index_exists
from .manifest import Manifest
from .store import FileRecord, Hit, Index, IndexWriter, NewChunk, live_manifest, open_writer

__all__ = ["FileRecord", "Hit", "Index", "IndexWriter", "Manifest", "NewChunk", "index_exists", "live_manifest",
           "open_writer"]
