"""``rag bench page``: the web page's time to first token against the
API's own, over a real server on 127.0.0.1 and Debian's Chromium.

Does not: start the server or Chromium, or measure anything itself
(``rag.bench.page`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..bench.setup import BENCH_DATA, DEFAULT_CHAT_CORPUS
from .bench_harness import harness
from .common import MODEL_OPTION, bench_app, echo_json, err, user_errors


@bench_app.command("page")
def bench_page(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Path = typer.Option(BENCH_DATA / "python_docs_dev.jsonl", "--questions", help="JSON lines of {question, gold}."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Answer tokens per request (TTFT does not depend on it)."),
    chromium: Optional[Path] = typer.Option(None, "--chromium", help="The Chromium to drive (default: $RAG_CHROMIUM, else chromium on the PATH)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """TTFT as the web page sees it (submit to the first streamed text drawn)
    against the API's own, each question asked once each way, interleaved."""
    from ..bench.page import run

    with user_errors():
        result = run(harness(), corpus, include, questions, index=index, max_tokens=max_tokens, chromium=chromium,
                     model=model)
    if as_json:
        echo_json(result)
        return
    s = result["summary"]
    table = Table(title=f"rag bench page ({result['config']['questions']} questions each way, {max_tokens} answer "
                        f"tokens)", title_justify="left")
    for column in ("way", "TTFT ms p50", "server's ttft_s ms p50", "above the server ms p50"):
        table.add_column(column, justify="right")
    table.add_row("page (first text drawn)", f"{s['page_ttft_ms_p50']}", f"{s['page_server_ttft_ms_p50']}",
                  f"{s['page_above_server_ms_p50']}")
    table.add_row("API client (first event)", f"{s['api_client_ttft_ms_p50']}", f"{s['api_ttft_ms_p50']}",
                  f"{s['api_client_above_server_ms_p50']}")
    Console(highlight=False).print(table)
    if s["errors"]:
        err().print(f"{s['errors']} requests failed; see --json")
