"""A folder of mixed documents, as people keep them: every format
rag-budget reads, each file holding a code word found nowhere else (so a
search can tell whether that file is searchable), beside the bad inputs an
ingest must report and survive; and :func:`check_folder`, what an ingest
of it must report and what search must find. For the tests and
``python -m tests.tools.bench_formats``.

Does not: measure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import samples

if TYPE_CHECKING:
    from rag.qa.pipeline import Pipeline

KINDS = ("md", "txt", "html", "pdf", "docx", "pptx", "xlsx", "csv", "epub", "py")
FILLER = ("Harbour logistics depend on the tides, the cranes and the weather. Ships queue at the outer "
          "anchorage until a berth is free, and the pilots guide them through the channel. ")


def code_word(n: int) -> str:
    """The word only file ``n`` holds: ``code_word(7) -> "zqv0007x"``."""
    return f"zqv{n:04d}x"


def _good(kind: str, n: int) -> bytes:
    """File ``n`` of ``kind``, its code word where that format keeps facts."""
    word, body = code_word(n), FILLER * 3
    fact = f"The inspection code for berth {n} is {word}."
    if kind == "md":
        return f"# Berth {n}\n\n{body}\n\n## Inspection\n\n{fact}\n".encode()
    if kind == "txt":
        return f"Berth {n}\n========\n\n{body}\n\n{fact}\n".encode()
    if kind == "html":
        return f"<html><head><title>Berth {n}</title></head><body><h1>Berth {n}</h1><p>{body}</p><p>{fact}</p></body></html>".encode()
    if kind == "pdf":
        return samples.make_pdf([f"Berth {n}. {FILLER[:80]}", fact])
    if kind == "docx":
        return samples.make_docx(f"Berth {n} report", [("Overview", [body])],
                                 [["Berth", "Inspection code"], [str(n), word]])
    if kind == "pptx":
        return samples.make_pptx([(f"Berth {n}", FILLER[:90], ""), ("Inspection", fact, "Mention the code.")])
    if kind == "xlsx":
        return samples.make_xlsx({"Berths": [["Berth", "Depth m", "Inspection code"], [n, 12, word], [n + 1, 9, "none"]]})
    if kind == "csv":
        return samples.make_csv([["Berth", "Depth m", "Inspection code"], [n, 12, word], [n + 1, 9, "none"]])
    if kind == "epub":
        return samples.make_epub(f"Berth {n} log", [("Arrival", [body]), ("Inspection", [fact])])
    if kind == "py":
        return (f'"""Berth {n} tools."""\n\n\ndef depth(berth):\n    """Depth of a berth in metres."""\n'
                f'    return 12\n\n\ndef inspection_code():\n    """{fact}"""\n    return "{word}"\n').encode()
    raise ValueError(kind)


def _bad_inputs(million_rows: bool) -> dict[str, tuple[Callable[[], bytes], str]]:
    """name -> (writer, a fragment of the line the ingest reports for it)."""
    plain_docx = samples.make_docx("Secret", [("Plan", ["Hidden plans."])])
    plain_xlsx = samples.make_xlsx({"S": [["a", "b"], [1, 2]]})
    bad: dict[str, tuple[Callable[[], bytes], str]] = {
        "locked.docx": (lambda: samples.encrypted_office(plain_docx), "password-protected"),
        "locked.xlsx": (lambda: samples.encrypted_office(plain_xlsx), "password-protected"),
        "locked.pdf": (lambda: samples.encrypted_pdf(["Secret page."]), "encrypted PDF"),
        "truncated.docx": (lambda: plain_docx[: len(plain_docx) // 2], "corrupt .docx"),
        "not-a-book.epub": (lambda: b"PK\x03\x04 this is no zip", "corrupt .epub"),
        "bomb.xlsx": (lambda: samples.zip_bomb(300 << 20), "zip bomb"),
        "empty.md": (lambda: b"", "no text"),
        "scan.pdf": (lambda: samples.scanned_pdf(["The scanned harbour log", "says berth nine is closed"]), "scanned"),
    }
    if million_rows:
        bad["million.xlsx"] = (lambda: samples.many_rows_xlsx(1_000_000), "rows were read")
    return bad


@dataclass
class MixedFolder:
    """What was written: good files by source with their code word and
    kind, bad ones with a fragment of their expected report line, files of
    types that cannot be read, and the file to delete mid-ingest."""

    root: Path
    good: dict[str, tuple[str, str]] = field(default_factory=dict)  # source -> (kind, code word)
    bad: dict[str, str] = field(default_factory=dict)  # source -> expected fragment
    unsupported: list[str] = field(default_factory=list)
    vanishing: str = "zz/vanishing.md"


def write_mixed_folder(root: Path, n_files: int, *, million_rows: bool = False) -> MixedFolder:
    """``n_files`` good files spread over every kind (in ``good/KIND/``),
    the bad inputs (in ``bad/``), two files of unreadable types, and a
    Markdown file meant to disappear while the ingest runs."""
    folder = MixedFolder(root)
    for n in range(n_files):
        kind = KINDS[n % len(KINDS)]
        source = f"good/{kind}/berth-{n:04d}.{kind}"
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        (root / source).write_bytes(_good(kind, n))
        folder.good[source] = (kind, code_word(n))
    (root / "bad").mkdir(parents=True, exist_ok=True)
    for name, (write, fragment) in _bad_inputs(million_rows).items():
        (root / "bad" / name).write_bytes(write())
        folder.bad[f"bad/{name}"] = fragment
    for name in ("photo.png", "tool.exe"):
        (root / name).write_bytes(b"\x89PNG\r\n\x1a\n" if name.endswith(".png") else b"MZ\x90\x00")
        folder.unsupported.append(name)
    (root / folder.vanishing).parent.mkdir(parents=True, exist_ok=True)  # a folder walked last
    (root / folder.vanishing).write_text("# Gone\n\nThis file is deleted while the ingest runs.\n")
    return folder


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
