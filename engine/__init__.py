"""Talking to inference engines behind one protocol.

``Backend`` is the seam; ``LlamaCppBackend`` runs a GGUF in this process;
``FakeBackend`` is a deterministic stand-in for unit tests of pure logic.
Importing this package loads no model and no native library.
"""

from .backend import Backend, ContextOverflow, Message, Timings, complete
from .fake import FakeBackend
from .models import ModelFileError, check_gguf, default_model_path

__all__ = [
    "Backend",
    "ContextOverflow",
    "FakeBackend",
    "LlamaCppBackend",
    "Message",
    "ModelFileError",
    "Timings",
    "check_gguf",
    "complete",
    "default_model_path",
]


def __getattr__(name: str):
    # The llama.cpp backend imports a native library; load it on first use.
    if name == "LlamaCppBackend":
        from .llama_cpp_backend import LlamaCppBackend

        return LlamaCppBackend
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
