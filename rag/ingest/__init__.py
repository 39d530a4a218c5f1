"""Documents into the index: reading files (``formats``), splitting them
(``chunking``), embedding (``embed``), the incremental ingest run (``run``)
and the library of an index's documents (``library``).

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"FoundFiles": ".files", "SourceFile": ".files", "find_files": ".files",
            "IngestProgress": ".run", "IngestReport": ".run", "ingest": ".run",
            # What the answer names of the documents: where a chunk lies, and which file names are documents.
            "Location": ".formats.document", "SUPPORTED_SUFFIXES": ".formats", "CODE_SUFFIXES": ".formats.code"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
