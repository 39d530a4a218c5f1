"""``rag mcp``: your documents as tools and resources for AI assistants
(Claude Desktop, VS Code, Cursor) over the Model Context Protocol, on
stdio, or on streamable HTTP with ``--http``. Tool calls reach the same
resident server ``rag ask`` does (``--no-server``: a pipeline in this
process), so a question costs what it costs there.

Does not: serve or answer by itself (``rag.mcp`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import INDEX_OPTION, MODEL_OPTION, NO_SERVER_OPTION, RETRIEVAL_OPTION, TARGET_OPTION, app, \
    question_pipeline, settings, user_errors

DEFAULT_MCP_PORT = 8765


@app.command()
def mcp(
    index: Optional[str] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    target_ttft: Optional[str] = TARGET_OPTION,
    retrieval: Optional[str] = RETRIEVAL_OPTION,
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio."),
    host: str = typer.Option("127.0.0.1", "--host", help="With --http: the address to listen on (loopback only "
                                                          "without the service's keys)."),
    port: int = typer.Option(DEFAULT_MCP_PORT, "--port", help="With --http: the port (0: any free one)."),
    no_server: bool = NO_SERVER_OPTION,
) -> None:
    """Serve your documents to AI assistants over MCP (stdio; --http for streamable HTTP): the tools search,
    ask, list_documents and read_document, and each document as rag://documents/{id}."""
    with user_errors():
        chosen = settings(index=index, model=model, target_ttft=target_ttft, retrieval=retrieval,
                          no_server=no_server or None)
        from ..mcp import serve

        serve(lambda: question_pipeline(chosen), http=http, host=host, port=port)
