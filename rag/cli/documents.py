"""``rag ingest``: files and folders into the index, incrementally, once or
each time they change (``--watch``).

Does not: read or chunk documents itself (``rag.ingest`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.markup import escape

from ..errors import engine_errors
from ..index.location import shown
from .common import COLLECTION_OPTION, INDEX_OPTION, IngestBar, app, counting, echo_json, err, command_pipeline, settings, user_errors

if TYPE_CHECKING:
    from ..ingest.run import IngestReport


@app.command()
def ingest(
    paths: List[Path] = typer.Argument(..., help="Files or folders to index."),
    index: Optional[str] = INDEX_OPTION,
    collection: str = COLLECTION_OPTION,
    include: List[str] = typer.Option([], "--include", help="Only files matching this glob (repeatable), e.g. '*.md'."),
    exclude: List[str] = typer.Option([], "--exclude", help="Skip files matching this glob (repeatable)."),
    chunk_tokens: Optional[int] = typer.Option(None, help="Chunk size in embedding-model tokens (default: 200, or the index's)."),
    overlap_tokens: Optional[int] = typer.Option(None, help="Overlap between chunks in tokens (default: 30, or the index's)."),
    max_file_mb: Optional[float] = typer.Option(
        None, "--max-file-mb", help="Skip files larger than this many MiB (default: $RAG_MAX_FILE_MB, else 16)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build the index anew from PATHs (repairs a damaged one)."),
    watch: bool = typer.Option(False, "--watch", help="Then keep watching PATHs and ingest again when files change; Ctrl-C stops."),
    precompute_kv: bool = typer.Option(
        False, "--precompute-kv", help="Then evaluate and store every chunk's passage KV (needs --splice-fresh)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (one line per ingest)."),
) -> None:
    """Index documents, incrementally: text, Markdown, reStructuredText, HTML,
    PDF, Word, PowerPoint, Excel, CSV, EPUB, man pages (name.1 to name.8,
    gzipped or not) and source code. --collection
    puts them in a named collection; no other collection is touched."""
    options = dict(include=include, exclude=exclude, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens)
    stored = None
    with user_errors(interrupted="interrupted; the index is as it was before this command"):
        p = command_pipeline(settings(index=index, max_file_mb=max_file_mb))
        if precompute_kv:
            p.passages.check()  # before the ingest: say now that it cannot be done
        with IngestBar.shown(transient=as_json) as bar:
            report = p.ingest(paths, rebuild=rebuild, progress=bar, collection=collection, **options)
        if precompute_kv:
            stored = _precompute(p, transient=as_json)
    print_report(report, p.index_location, as_json, stored)
    if not watch:
        if report.failed or report.nothing_indexed():
            raise typer.Exit(1)
        return
    err().print(f"[dim]watching {', '.join(escape(str(x)) for x in paths)} for changes; Ctrl-C stops[/]", soft_wrap=True)

    def changed(done: IngestReport | None, problem: str | None, n_changes: int) -> None:
        if done is None:
            err().print(f"[bold red]error:[/] {escape(problem or 'ingest failed')}; still watching", soft_wrap=True)
        elif done.added or done.updated or done.removed or done.failed or as_json:
            print_report(done, p.index_location, as_json)

    with user_errors():
        try:
            p.library.watch(paths, changed, max_file_bytes=p.settings.max_file_bytes, collection=collection, **options)
        except KeyboardInterrupt:  # the way to stop watching: a clean end, not an error
            pass
    err().print("stopped watching; the index holds the last change published")


def print_report(report: IngestReport, index_location: Path | str, as_json: bool, stored: dict | None = None) -> None:
    """The report of one ingest (and of the passage KV it stored): JSON on
    stdout, or counts and one line per file that was not indexed (or
    indexed in part) on stderr."""
    if as_json:
        echo_json({"index": shown(index_location), **report.to_dict(), **({"passage_kv": stored} if stored else {})})
        return
    c = report.counts()
    rate = report.chunks_added / report.seconds if report.seconds else 0.0
    reused = report.chunks_added - report.chunks_embedded
    console = err()
    console.print(
        f"added {c['added']}, updated {c['updated']}, removed {c['removed']}, skipped {c['skipped']}, "
        f"failed {c['failed']}: {report.chunks_added} chunks in {report.seconds:.1f} s ({rate:.1f} chunks/s"
        f"{f', {reused} unchanged chunks not embedded again' if reused else ''}) into {shown(index_location)}",
        soft_wrap=True,
    )
    for source, problem in report.failed:
        console.print(f"[red]failed:[/] {escape(source)}: {escape(problem)}", soft_wrap=True)
    for source, reason in report.ignored:
        console.print(f"[yellow]skipped:[/] {escape(source)}: {escape(reason)}", soft_wrap=True)
    for source, warning in report.warnings:
        console.print(f"[yellow]partly:[/] {escape(source)}: {escape(warning)}", soft_wrap=True)
    if report.unsupported:
        console.print(f"[yellow]not read:[/] {escape(report.unsupported_text())} (types rag-budget cannot read)",
                      soft_wrap=True)
    for glob in report.unmatched:
        console.print(f"[yellow]note:[/] {escape(repr(glob))} matched no file", soft_wrap=True)
    why = report.nothing_indexed()
    if why:
        console.print(f"[bold yellow]{escape(why)}[/]", soft_wrap=True)
    if stored:
        console.print(
            f"passage KV: {stored['computed']} computed, {stored['stored_before']} already stored, of "
            f"{stored['passages']}; the store holds {stored['ram_bytes'] / 2**20:.1f} MiB in RAM and "
            f"{stored['disk_bytes'] / 2**20:.1f} MiB on disk, {stored['bytes_per_passage'] / 2**10:.0f} KiB a passage",
            soft_wrap=True)


def _precompute(p, *, transient: bool) -> dict[str, int]:
    """Every chunk's passage KV evaluated and stored, with a progress bar."""
    with engine_errors():
        p.warm_up()  # passages are computed behind the cached system prompt
    with counting("storing passage KV", transient=transient) as update, engine_errors():
        return p.passages.precompute(update)
