"""rag-budget as an MCP server: the documents of an index as tools
(``search``, ``ask``, ``list_documents``, ``read_document``) and resources
(``rag://documents/{id}``) for AI assistants, with the official ``mcp``
SDK, over stdio or streamable HTTP on loopback. See README.md beside this
file for adding it to Claude Desktop or VS Code.

``connection`` opens what answers (the resident server's client, as ``rag
ask`` uses it, or a pipeline in this process), ``tools`` is what each tool
does over it, ``server`` the MCP server and its transports.

Importing this package imports neither the SDK nor any model: :func:`serve` does.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Callable

from ..errors import RagError

if TYPE_CHECKING:
    from .connection import Answerer


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``).
    (As ``rag.service.settings.is_loopback``, without importing the service.)"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(open_answerer: Callable[[], "Answerer"], *, http: bool = False, host: str = "127.0.0.1",
          port: int = 8765) -> None:
    """Serve MCP until the client hangs up (stdio) or until interrupted
    (``http``: streamable HTTP at ``http://HOST:PORT/mcp``, with the
    service's settings: with its keys, each call as its key's holder, else
    loopback only; and its limits). ``open_answerer`` gives what answers;
    it is called once, in the background as soon as the server runs. A
    RagError for a host off loopback or a port that cannot be had."""
    from .connection import Connection

    settings = None
    if http:
        from ..service.settings import ServiceSettings

        # The service's keys (RAG_SERVE_KEYS_FILE, RAG_SERVE_API_KEYS) and limits; the Host its gate expects.
        settings = ServiceSettings(host=host)
        if not is_loopback(host) and not settings.keyed:
            raise RagError(f"--host {host}: without keys rag mcp listens on loopback only (127.0.0.1, ::1 or "
                           "localhost); set RAG_SERVE_KEYS_FILE (or RAG_SERVE_API_KEYS) to serve beyond it")
        if not 0 <= port <= 65535:
            raise RagError(f"--port {port}: give a port between 0 and 65535")
    connection = Connection(open_answerer)
    try:
        from . import server

        if settings is not None:
            server.serve_http(connection, host, port, settings)
        else:
            server.serve_stdio(connection)
    finally:
        connection.close()


__all__ = ["serve"]
