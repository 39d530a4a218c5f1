"""The errors an engine raises: one tree, so the layer above maps them to
its own errors in one place (``rag.errors.from_engine``).

Every message is one line for a person: what went wrong and what to do.

Does not: decide how a failure is shown (the CLI, the service and the
Python API each do that above the seam).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error an engine raises on purpose."""


class ContextOverflow(EngineError):
    """The prompt plus the reserved answer tokens do not fit the context window."""


class ModelFileError(EngineError):
    """The model file is missing, unreadable, or not a model llama.cpp can load."""


class InsufficientMemory(EngineError):
    """The weights and the KV cache of the asked context do not fit the free memory."""


class EngineSettingsError(EngineError):
    """Engine options that cannot work together (a quantised KV cache without
    flash attention, a KV type the engine does not offer)."""


class EngineUnreachable(EngineError):
    """A remote engine did not answer, answered with an error, or broke off a stream."""


class GenerationFailed(EngineError):
    """The engine failed while evaluating a prompt or decoding (its KV cache is full)."""


class GenerationCancelled(EngineError):
    """The request was stopped from outside (its caller cancelled it) before it ended."""


class EngineCrashed(EngineError):
    """llama.cpp's own code dies on this machine (a signal, a hang) in every
    configuration the engine can choose; the message says how to rebuild it."""
