"""Documents into the index: reading files (``formats``), splitting them
(``chunking``), embedding (``embed``), the incremental ingest run (``run``)
and the library of an index's documents (``library``)."""

from .files import FoundFiles, SourceFile, find_files
from .run import IngestProgress, IngestReport, ingest

__all__ = ["FoundFiles", "IngestProgress", "IngestReport", "SourceFile", "find_files", "ingest"]
