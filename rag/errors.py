"""Errors that rag-budget raises for things a user can fix.

Every message is one line that names the file or value at fault and says
what to do; the CLI prints it as is, without a traceback.
"""

from __future__ import annotations


class RagError(Exception):
    """Base of every error meant for the user rather than for a developer."""


class DocumentError(RagError):
    """A document could not be read or holds no text to index."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


class IndexNotFound(RagError):
    """No index exists where one was asked for."""


class IndexMismatch(RagError):
    """The index on disk was written by another format version, embedder or
    chunker than the one asked for."""


class IndexBusy(RagError):
    """Another process is writing the index."""


class QuestionTooLong(RagError):
    """The question alone does not fit the model's context window."""


class ModelNotFound(RagError):
    """The GGUF model file is missing or cannot be loaded."""


class EngineUnavailable(RagError):
    """The inference engine cannot run as asked: too little memory for the
    context, or a server that does not answer."""


class DocumentNotFound(RagError):
    """No document with that id in the index."""
