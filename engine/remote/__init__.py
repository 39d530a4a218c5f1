"""Engines in other processes, reached over HTTP.

``backend.RemoteBackend`` is one OpenAI-compatible server (llama-server,
vLLM); ``pool.EnginePool`` puts several such servers behind one Backend
(load, health checks, failover) and hands out a ``pool.Route`` per prompt;
``routing`` decides which engine serves a prompt (pure: affinity, round
robin, least loaded; ``routing.POLICIES``).

Importing this package imports nothing: each module is imported by name.
"""
