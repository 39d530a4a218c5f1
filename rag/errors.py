"""Errors that rag-budget raises for things a user can fix.

Every message is one line that names the file or value at fault and says
what to do; the CLI prints it as is, without a traceback.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit


class RagError(Exception):
    """Base of every error meant for the user rather than for a developer."""


class UnknownOption(RagError, TypeError):
    """A question's option nobody takes: a RagError for a front end that
    shows its message, a TypeError for a Python caller (issue 56)."""


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


class IndexDamaged(RagError):
    """No generation of the index can be read: a file is damaged or missing."""


class IndexBusy(RagError):
    """Another process is writing the index."""


class QuestionTooLong(RagError):
    """The question alone does not fit the model's context window."""


class ModelNotFound(RagError):
    """The GGUF model file is missing or cannot be loaded."""


class EngineUnavailable(RagError):
    """The inference engine cannot run as asked: too little memory for the
    context, or a server that does not answer."""


class Overloaded(RagError):
    """The engine is too busy for this question to meet its deadline even
    with no passages; it may be asked again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DocumentNotFound(RagError):
    """No document with that id in the index."""


class CollectionNotFound(RagError):
    """No collection of that name holds documents (or, to a caller that may
    not read it, none that it may see: the two are told alike)."""


class SessionNotFound(RagError):
    """No conversation of that id for this caller: the id is another's."""


class EngineMisconfigured(RagError):
    """Engine options that cannot work together, such as a quantised KV
    cache without flash attention."""


def from_engine(exc: Exception) -> RagError:
    """The RagError a user is shown for an engine's error: the one place
    where the engine's error tree meets rag-budget's.

    ``from_engine(ModelFileError("x.gguf: no such model file"))`` is a ModelNotFound.
    """
    from engine.errors import (
        ContextOverflow,
        EngineCrashed,
        EngineSettingsError,
        EngineUnreachable,
        GenerationFailed,
        InsufficientMemory,
        ModelFileError,
    )

    message = str(exc)
    if isinstance(exc, ModelFileError):
        return ModelNotFound(message)
    if isinstance(exc, EngineSettingsError):
        return EngineMisconfigured(f"engine settings: {message}")
    if isinstance(exc, ContextOverflow):
        return QuestionTooLong(message)
    if isinstance(exc, (InsufficientMemory, EngineUnreachable, GenerationFailed, EngineCrashed)):
        return EngineUnavailable(message)
    return EngineUnavailable(f"the engine failed: {message}")


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Inside this block, an engine's error leaves as its RagError (see :func:`from_engine`)."""
    from engine.errors import EngineError

    try:
        yield
    except EngineError as exc:
        raise from_engine(exc) from None


def redacted(url: str) -> str:
    """``url`` without its password, for messages.

    ``redacted("postgresql://rag:secret@db/x") -> "postgresql://rag@db/x"``
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urlsplit can read (a stray "[", a bad port): hide what could be one
        return re.sub(r"(//[^/:@]*):[^/@]*@", r"\1@", url)
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host))
