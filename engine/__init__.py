"""Talking to inference engines behind one protocol.

``Backend`` is the seam and ``PrefixCache`` an optional ability of it;
``Generation`` is a completion in progress; ``LlamaCppBackend`` runs a GGUF
in this process, ``RemoteBackend`` talks to an OpenAI-compatible server;
``FakeBackend`` is a deterministic stand-in for unit tests of pure logic.
Every failure is an ``EngineError``. Importing this package loads no model
and no native library.

The protocol and the pure parts are at this level; the in-process engine's
parts are in ``engine.llama_cpp``, the engines over HTTP (one server, a pool
of them and its routing) in ``engine.remote``.
"""

from .backend import Backend, Generation, LoadAware, Message, PrefixCache, Scheduled, Timings
from .errors import (
    ContextOverflow,
    EngineError,
    EngineSettingsError,
    EngineUnreachable,
    GenerationCancelled,
    GenerationFailed,
    InsufficientMemory,
    ModelFileError,
)
from .fake import FakeBackend
from .models import check_gguf, default_model_path

__all__ = [
    "Backend",
    "ContextOverflow",
    "EngineError",
    "EngineSettingsError",
    "EngineUnreachable",
    "FakeBackend",
    "Generation",
    "GenerationCancelled",
    "GenerationFailed",
    "InsufficientMemory",
    "LoadAware",
    "Scheduled",
    "LlamaCppBackend",
    "Message",
    "ModelFileError",
    "PrefixCache",
    "Timings",
    "check_gguf",
    "default_model_path",
]


def __getattr__(name: str):
    # The llama.cpp backend imports a native library; load it on first use.
    if name == "LlamaCppBackend":
        from .llama_cpp.backend import LlamaCppBackend

        return LlamaCppBackend
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
