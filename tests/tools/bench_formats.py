"""A generated folder of mixed documents (every format, plus bad inputs)
ingested the way a user would, checked and timed; once ``rag bench
formats``, now a developer's script (its writers are test support):

    python -m tests.tools.bench_formats [--files 200] [--no-million-rows] [--json]

run from the repository root. Checks: the whole folder ingests without an
exception escaping, every bad file is reported on its own line (``failed``
or ``warnings``), files of unreadable types are counted, and every good
file is searchable (its code word, found nowhere else, retrieves it first).
Times: each format ingested alone into a fresh index, files and chunks per
second, and the share of the time spent embedding. Settings come from the
``RAG_*`` variables, as for ``rag``. Exits 1 when a check fails.

Does not: generate answers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from rag.qa.pipeline import Pipeline
from rag.settings import Settings
from tests.support.mixed import KINDS, MixedFolder, check_folder, write_mixed_folder


def format_rates(open_pipeline: Callable[[Path], Pipeline], folder: MixedFolder, work: Path) -> list[dict[str, object]]:
    """Each kind's good files ingested alone into a fresh index: files,
    chunks, seconds, rates and the share of time spent embedding."""
    rows = []
    for kind in KINDS:
        files = [s for s, (k, _) in folder.good.items() if k == kind]
        if not files:
            continue
        pipeline = open_pipeline(work / f"index-{kind}")
        report = pipeline.ingest([folder.root / "good" / kind])
        seconds = max(report.seconds, 1e-9)
        rows.append({
            "format": kind, "files": len(report.added), "chunks": report.chunks_added,
            "seconds": round(report.seconds, 2), "files_per_s": round(len(report.added) / seconds, 2),
            "chunks_per_s": round(report.chunks_added / seconds, 1),
            "reading_s": round(report.seconds_reading, 2), "embedding_s": round(report.seconds_embedding, 2),
            "embedding_share": round(report.seconds_embedding / seconds, 3), "failed": len(report.failed),
        })
        pipeline.close()
    return rows


def bench_formats(open_pipeline: Callable[[Path], Pipeline], n_files: int, *, million_rows: bool = True,
                  work: Path | None = None) -> dict[str, object]:
    """The bench object: per-format rates (rows) and the mixed folder's checks (summary)."""
    work = Path(work or tempfile.mkdtemp(prefix="rag-bench-formats-"))
    try:
        folder = write_mixed_folder(work / "docs", n_files, million_rows=million_rows)
        rows = format_rates(open_pipeline, folder, work)
        checks = check_folder(open_pipeline(work / "index-all"), folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    embed = sum(float(r["embedding_s"]) for r in rows)
    total = sum(float(r["seconds"]) for r in rows)
    return {
        "bench": "formats",
        "config": {"files": n_files, "kinds": list(KINDS), "bad_inputs": len(folder.bad), "million_rows": million_rows},
        "rows": rows,
        "summary": {**checks, "embedding_share": round(embed / total, 3) if total else None,
                    "ok": not (checks["bad_unreported"] or checks["bad_misreported"] or checks["good_not_found"])
                    and bool(checks["vanished_reported"])},
    }


def _print(result: dict[str, object], files: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"formats bench ({files} files; each format ingested alone)", title_justify="left")
    for c in ("format", "files", "chunks", "s", "files/s", "chunks/s", "reading s", "embedding s", "embedding share"):
        table.add_column(c, justify="left" if c == "format" else "right")
    for r in result["rows"]:
        table.add_row(r["format"], str(r["files"]), str(r["chunks"]), f"{r['seconds']:.1f}", f"{r['files_per_s']:.1f}",
                      f"{r['chunks_per_s']:.1f}", f"{r['reading_s']:.1f}", f"{r['embedding_s']:.1f}",
                      f"{r['embedding_share']:.0%}")
    console = Console(highlight=False)
    console.print(table)
    s = result["summary"]
    console.print(f"whole folder: {s['files_indexed']} files, {s['chunks']} chunks in {s['seconds']} s "
                  f"(reading {s['reading_s']} s, embedding {s['embedding_s']} s); "
                  f"{s['failed']} failed and {s['warnings']} partly read, each on its own line:", soft_wrap=True)
    for line in s["report_lines"]:
        console.print(f"  {line}", soft_wrap=True, markup=False)
    console.print(f"unreadable types counted: {s['unsupported']}; bad files unreported: {s['bad_unreported'] or 'none'}; "
                  f"misreported: {s['bad_misreported'] or 'none'}; good files not found: {s['good_not_found'] or 'none'}",
                  soft_wrap=True, markup=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.bench_formats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200, help="Good files to generate, spread over every format (at least 10).")
    parser.add_argument("--million-rows", action=argparse.BooleanOptionalAction, default=True,
                        help="Add a spreadsheet of a million rows to the bad inputs (slow to write).")
    parser.add_argument("--json", action="store_true", help="Print the bench object as JSON.")
    args = parser.parse_args(argv)
    if args.files < 10:
        parser.error("--files: at least 10")
    base = Settings.load()
    result = bench_formats(lambda index: Pipeline.open(settings=base.model_copy(update={"index": index})), args.files,
                           million_rows=args.million_rows)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result, args.files)
    return 0 if result["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
