"""``rag ingest``: files and folders into the index, incrementally.

Does not: read or chunk documents itself (``rag.ingest`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from .common import INDEX_OPTION, IngestBar, app, echo_json, err, command_pipeline, settings, user_errors


@app.command()
def ingest(
    paths: List[Path] = typer.Argument(..., help="Files or folders to index."),
    index: Optional[Path] = INDEX_OPTION,
    include: List[str] = typer.Option([], "--include", help="Only files matching this glob (repeatable), e.g. '*.md'."),
    exclude: List[str] = typer.Option([], "--exclude", help="Skip files matching this glob (repeatable)."),
    chunk_tokens: Optional[int] = typer.Option(None, help="Chunk size in embedding-model tokens (default: 200, or the index's)."),
    overlap_tokens: Optional[int] = typer.Option(None, help="Overlap between chunks in tokens (default: 30, or the index's)."),
    max_file_mb: Optional[float] = typer.Option(
        None, "--max-file-mb", help="Skip files larger than this many MiB (default: $RAG_MAX_FILE_MB, else 16)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build the index anew from PATHs (repairs a damaged one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Index documents (.txt .md .rst .html .pdf), incrementally."""
    with user_errors(interrupted="interrupted; the index is as it was before this command"):
        p = command_pipeline(settings(index=index, max_file_mb=max_file_mb))
        with IngestBar.shown(transient=as_json) as bar:
            report = p.ingest(paths, include=include, exclude=exclude, chunk_tokens=chunk_tokens,
                              overlap_tokens=overlap_tokens, rebuild=rebuild, progress=bar)
    if as_json:
        echo_json({"index": str(p.index_dir), **report.to_dict()})
    else:
        c = report.counts()
        rate = report.chunks_added / report.seconds if report.seconds else 0.0
        reused = report.chunks_added - report.chunks_embedded
        err().print(
            f"added {c['added']}, updated {c['updated']}, removed {c['removed']}, skipped {c['skipped']}, "
            f"failed {c['failed']}: {report.chunks_added} chunks in {report.seconds:.1f} s ({rate:.1f} chunks/s"
            f"{f', {reused} unchanged chunks not embedded again' if reused else ''}) into {p.index_dir}",
            soft_wrap=True,
        )
        for source, problem in report.failed:
            err().print(f"[red]failed:[/] {escape(source)}: {escape(problem)}", soft_wrap=True)
        for source, reason in report.ignored:
            err().print(f"[yellow]skipped:[/] {escape(source)}: {escape(reason)}", soft_wrap=True)
        for glob in report.unmatched:
            err().print(f"[yellow]note:[/] {escape(repr(glob))} matched no file", soft_wrap=True)
    if report.failed:
        raise typer.Exit(1)
