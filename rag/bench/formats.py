"""``rag bench formats``: a generated folder of mixed documents (every
format, plus bad inputs) ingested the way a user would, checked and timed.

Checks: the whole folder ingests without an exception escaping, every bad
file is reported on its own line (``failed`` or ``warnings``), files of
unreadable types are counted, and every good file is searchable (its code
word, found nowhere else, retrieves it first). Times: each format ingested
alone into a fresh index, files and chunks per second, and the share of the
time spent embedding.

:func:`run` is the whole of ``rag bench formats``.

Does not: generate answers.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..qa.pipeline import Pipeline
from . import setup
from .mixed import KINDS, MixedFolder, write_mixed_folder
from .setup import Harness


class _Vanisher:
    """An ingest progress that deletes a file once the first file is done,
    so it disappears while the ingest runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def start(self, total_files: int, total_bytes: int) -> None:
        pass

    def advance(self, files: int, chunks: int, nbytes: int) -> None:
        if files:
            self.path.unlink(missing_ok=True)


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


def check_folder(pipeline: Pipeline, folder: MixedFolder) -> dict[str, object]:
    """Ingest the whole mixed folder (one file vanishing midway) and check
    what the report says and what search finds."""
    started = time.perf_counter()
    report = pipeline.ingest([folder.root], progress=_Vanisher(folder.root / folder.vanishing))
    seconds = time.perf_counter() - started
    said = {s: e for s, e in report.failed} | {s: w for s, w in report.warnings}
    unreported = [s for s in folder.bad if s not in said]
    wrong = [s for s, fragment in folder.bad.items() if s in said and fragment not in said[s]
             and not (fragment == "scanned" and s in report.added)]  # read with OCR where installed
    lost = [s for s, (_, word) in folder.good.items()
            if not any(h.source == s for h in pipeline.search(word, k=3, mode="bm25"))]
    return {
        "files_indexed": len(report.added), "chunks": report.chunks_added, "seconds": round(seconds, 1),
        "reading_s": round(report.seconds_reading, 1), "embedding_s": round(report.seconds_embedding, 1),
        "failed": len(report.failed), "warnings": len(report.warnings), "unsupported": dict(report.unsupported),
        "bad_unreported": unreported, "bad_misreported": wrong, "good_not_found": lost,
        "vanished_reported": folder.vanishing in said,
        "report_lines": [f"{s}: {e}" for s, e in report.failed] + [f"{s}: {w}" for s, w in report.warnings],
    }


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


def run(h: Harness, files: int = 200, *, million_rows: bool = True) -> dict[str, object]:
    """``rag bench formats``: :func:`bench_formats` with pipelines of the
    harness's settings, each over an index of its own."""
    base = h.settings()
    with h.status("writing and ingesting the folder"):
        return bench_formats(lambda index: h.open(base.model_copy(update={"index": index})), files,
                             million_rows=million_rows)


def main() -> None:
    """``python -m rag.bench.formats``: ``rag bench formats`` on its own."""
    setup.command_alone("formats")


if __name__ == "__main__":
    main()
