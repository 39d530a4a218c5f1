"""Documents into the index: reading files (``loaders``), splitting them
(``chunking``), embedding (``embed``), the incremental ingest run (``run``)
and the library of an index's documents (``library``)."""

from .run import IngestProgress, IngestReport, find_files, ingest

__all__ = ["IngestProgress", "IngestReport", "find_files", "ingest"]
