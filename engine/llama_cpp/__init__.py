"""The in-process llama.cpp engine: one GGUF model, one context, several
requests at once.

``backend.LlamaCppBackend`` is its Backend. Behind it: ``loop`` (the one
thread that owns the context and evaluates a batch per step), ``requests``
(a request and its state while it holds a sequence), ``slots`` (which
sequences are in use, what idle ones still hold), ``placement`` (where a new
request starts in the KV cache), ``snapshots`` (sessions' KV kept across
requests, RAM and disk), ``passage_kv`` and ``splicing`` (passages' KV kept
and spliced into prompts), ``passage_shelf`` (the store as callers see it),
``native`` (llama.cpp's C API for several sequences), ``internals`` (every
use of llama-cpp-python's private parts), ``memory`` (planning memory before
a load) and ``faults`` (fault injection for tests and ``rag bench faults``).

Importing this package imports nothing: each module is imported by name.
"""
