"""The ``rag`` command: a thin layer over :class:`rag.Pipeline`.

Parses arguments, calls the Python API, and formats what comes back. Errors
meant for the user are printed as one line on stderr with a non-zero exit.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .answer import Answer
from .errors import RagError
from .pipeline import DEFAULT_MAX_TOKENS, DEFAULT_TOP_K, Pipeline

app = typer.Typer(
    name="rag",
    help="Local document question answering that treats the prompt as a cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

INDEX_OPTION = typer.Option(
    None, "--index", envvar="RAG_INDEX", help="Index directory [default: $RAG_INDEX, else ~/.local/share/rag-budget/index]."
)
MODEL_OPTION = typer.Option(None, "--model", envvar="RAG_MODEL", help="GGUF model file [default: bundled SmolLM2-135M-Instruct].")


def _err() -> Console:
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Turn errors meant for the user into one line on stderr and exit 1."""
    try:
        yield
    except RagError as exc:
        _err().print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        _err().print("interrupted; the index is as it was before this command")
        raise typer.Exit(130) from None


def _open_pipeline(index: Optional[Path], model: Optional[Path] = None) -> Pipeline:
    """The pipeline a command works on (one place, so tests can share loaded models)."""
    return Pipeline.open(index, model)


def _echo_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class _RateColumn(ProgressColumn):
    """Files per second and chunks per second since the start."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("", style="progress.data.speed")
        chunks = task.fields.get("chunks", 0)
        return Text(f"{task.completed / elapsed:.1f} files/s  {chunks} chunks  {chunks / elapsed:.1f} chunks/s",
                    style="progress.data.speed")


class _RichIngestProgress:
    """Draws ingest progress as a rich bar on stderr."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = None
        self._chunks = 0

    def start(self, total_files: int) -> None:
        self._task = self._progress.add_task("ingesting", total=total_files, chunks=0)

    def advance(self, files: int, chunks: int) -> None:
        self._chunks += chunks
        self._progress.update(self._task, advance=files, chunks=self._chunks)


@app.command()
def ingest(
    paths: List[Path] = typer.Argument(..., help="Files or folders to index."),
    index: Optional[Path] = INDEX_OPTION,
    include: List[str] = typer.Option([], "--include", help="Only files matching this glob (repeatable), e.g. '*.md'."),
    exclude: List[str] = typer.Option([], "--exclude", help="Skip files matching this glob (repeatable)."),
    chunk_tokens: Optional[int] = typer.Option(None, help="Chunk size in embedding-model tokens [default: 200, or the index's]."),
    overlap_tokens: Optional[int] = typer.Option(None, help="Overlap between chunks in tokens [default: 30, or the index's]."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Index documents (.txt .md .rst .html .pdf), incrementally."""
    with _user_errors():
        pipeline = _open_pipeline(index)
        with Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
            _RateColumn(), TimeElapsedColumn(), console=_err(), transient=as_json,
        ) as bar:
            report = pipeline.ingest(
                paths, include=include, exclude=exclude, chunk_tokens=chunk_tokens,
                overlap_tokens=overlap_tokens, progress=_RichIngestProgress(bar),
            )
    if as_json:
        _echo_json({"index": str(pipeline.index_dir), **report.to_dict()})
    else:
        c = report.counts()
        rate = report.chunks_added / report.seconds if report.seconds else 0.0
        _err().print(
            f"added {c['added']}, updated {c['updated']}, removed {c['removed']}, skipped {c['skipped']}, "
            f"failed {c['failed']}: {report.chunks_added} chunks in {report.seconds:.1f} s ({rate:.1f} chunks/s) "
            f"into {pipeline.index_dir}",
            soft_wrap=True,
        )
        for source, error in report.failed:
            _err().print(f"[red]failed:[/] {source}: {error}", soft_wrap=True)
    if report.failed:
        raise typer.Exit(1)


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    index: Optional[Path] = INDEX_OPTION,
    k: int = typer.Option(5, "-k", help="How many chunks to return."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Show the chunks most similar to QUERY, without asking the model."""
    with _user_errors():
        hits = _open_pipeline(index).search(query, k=k)
    if as_json:
        _echo_json({"results": [h.to_dict() for h in hits]})
        return
    console = Console(highlight=False)
    if not hits:
        console.print("no results (is the index empty?)")
    for rank, h in enumerate(hits, start=1):
        where = h.source if h.page is None else f"{h.source} p.{h.page}"
        console.print(f"[bold]{rank}. {where}[/]  score {h.score:.3f}  [dim]{h.chunk_id}[/]")
        console.print(" ".join(h.text.split())[:300], soft_wrap=True)
        console.print()


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer from your documents."),
    index: Optional[Path] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--max-tokens", help="Most tokens in the answer."),
    k: int = typer.Option(DEFAULT_TOP_K, "-k", help="Chunks to retrieve into the prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer, sources, budget and timings as JSON."),
) -> None:
    """Answer QUESTION from the index, streaming, then list the sources."""
    with _user_errors():
        pipeline = _open_pipeline(index, model)
        if as_json:
            _echo_json(pipeline.ask(question, max_tokens=max_tokens, k=k).to_dict())
            return
        answer = None
        for item in pipeline.stream(question, max_tokens=max_tokens, k=k):
            if isinstance(item, Answer):
                answer = item
            else:
                sys.stdout.write(item)
                sys.stdout.flush()
    assert answer is not None
    sys.stdout.write("\n")
    console = Console(highlight=False)
    console.print("\n[bold]Sources[/]")
    for n, s in enumerate(answer.sources, start=1):
        where = s.source if s.page is None else f"{s.source} p.{s.page}"
        console.print(f"  [{n}] {where}  (score {s.score:.3f})")
    t = answer.timings
    _err().print(
        f"[dim]{t.prompt_tokens} prompt tokens ({t.cached_tokens} cached), TTFT {t.ttft_s:.2f} s, "
        f"{t.decode_tokens} tokens in {t.total_s:.2f} s[/]"
    )


@app.command()
def doctor(
    index: Optional[Path] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Versions, llama.cpp build, device, model, context, threads and index statistics."""
    with _user_errors():
        report = _open_pipeline(index, model).doctor()
    if as_json:
        _echo_json(report)
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("python", str(report["python"]))
    for name, version in report["versions"].items():
        table.add_row(name, version or "[red]not installed[/]")
    engine = report["engine"]
    for key in ("build", "device", "n_gpu_layers", "model_path", "model_bytes", "n_ctx", "n_threads", "n_batch"):
        value = engine[key]
        if key == "model_bytes":
            value = f"{value / 1e6:.1f} MB"
        table.add_row(key, str(value))
    for key, value in report["index"].items():
        table.add_row(f"index.{key}", str(value))
    Console(highlight=False, soft_wrap=False).print(table)


def main() -> None:
    """Entry point of the ``rag`` console script."""
    app()
