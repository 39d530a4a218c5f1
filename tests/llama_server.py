"""The llama-server the tests start: see ``rag.bench.llama_server`` (the
bench ``rag bench serve --engines`` finds or builds it the same way)."""

from rag.bench.llama_server import LlamaServer, server_binary

__all__ = ["LlamaServer", "server_binary"]
