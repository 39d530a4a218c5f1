"""Engines in other processes, reached over HTTP.

``backend.RemoteBackend`` is the client of one OpenAI-compatible address: a
server (llama-server, vLLM) or a router in front of several (vLLM's
``vllm-router``), which routes, retries and takes dead workers out;
``router.RouterProcess`` starts that router over several URLs;
``llama_server.LlamaServer`` starts llama.cpp's own server on 127.0.0.1
(built once from the installed llama-cpp-python's sources), for
``rag bench serve --engines`` and the tests.

Importing this package imports nothing: each module is imported by name.
"""
