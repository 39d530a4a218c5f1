"""The document-QA HTTP service: a thin FastAPI layer over :class:`Pipeline`.

Endpoints: ``POST /v1/ask`` (the ``rag ask --json`` contract; server-sent
events with ``stream``), ``POST /v1/chat/completions`` (OpenAI-compatible,
with the sources in an extra ``sources`` field), ``/v1/documents`` (and
each document's text and file), ``/v1/sessions``, ``/v1/profile``,
``GET /healthz``, ``GET /metrics`` (Prometheus), the OpenAPI docs at
``/docs``, and the web page at ``/`` (``web``), a client of the same API.

One model serves every request: requests queue for the engine, and the
engine's report of its queue is what the budgeter plans and admits by. The names below are
imported on first use (:func:`rag.lazy_exports`), so that what the MCP
server shares with it (``keys``, ``owners``) comes without FastAPI.
"""

from .. import lazy_exports

_EXPORTS = {"create_app": ".app", "serve": ".app", "LoopbackServer": ".loopback", "ServiceSettings": ".settings"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
