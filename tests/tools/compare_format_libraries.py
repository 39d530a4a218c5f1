"""Which libraries read .docx, .pptx, .xlsx and .epub best for rag-budget:
fidelity on sample files and speed, ours (python-docx, python-pptx,
openpyxl, the standard library's zipfile for EPUB, as ``rag.ingest.formats``
uses them) against markitdown. Install sizes are measured apart, with
``pip install --target DIR PACKAGE`` and ``du -sb DIR`` (README, "Formats").

Run once from the repository root: ``python -m tests.tools.compare_format_libraries [--markitdown DIR]``
where DIR holds markitdown installed with ``pip install --target DIR
'markitdown[docx,pptx,xlsx]'`` (it is not a dependency of rag-budget).

Does not: install anything.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from rag.ingest.formats import load_document
from tests.support import samples

SAMPLES = {
    ".docx": lambda: samples.make_docx(
        "Harbour report", [("Tides", ["The tide rises at dawn."] * 20), ("Boats", ["Ferries leave hourly."] * 20)],
        [["Port", "Depth", "Berths"]] + [[f"Port {i}", f"{i} m", str(i)] for i in range(40)] + [["Tromsø", "9 m", "22"]]),
    ".pptx": lambda: samples.make_pptx([(f"Slide title {n}", f"Body text {n} " * 20, f"Speaker note {n}") for n in range(1, 13)]),
    ".xlsx": lambda: samples.make_xlsx({"Sales": [["Region", "Units sold"]] + [[f"District {i}", i] for i in range(500)]
                                        + [["Fjordland", 4242]], "Costs": [["Item", "EUR"], ["Rent", 900]]}),
    ".epub": lambda: samples.make_epub("Voyage", [(f"Chapter {n}", [f"Paragraph {n}.{i}." for i in range(30)])
                                                  for n in range(1, 9)]),
}


def _line_with(text: str, needle: str) -> str:
    return next((line for line in text.splitlines() if needle in line), "")


def checks_ours(suffix: str, data: bytes) -> dict[str, bool]:
    doc = load_document("x" + suffix, suffix, data)
    t = doc.text
    if suffix == ".docx":
        return {"text": "tide rises" in t, "headings": "Tides" in [h for _, _, h in doc.headings],
                "header with every table row": "Depth" in _line_with(t, "Tromsø")}
    if suffix == ".pptx":
        seg = doc.segment_at(t.index("Body text 7"))
        return {"text": "Body text 12" in t, "notes": "Speaker note 5" in t,
                "slide of a passage": seg is not None and seg.location.slide == 7}
    if suffix == ".xlsx":
        at = t.index("Fjordland")
        loc = doc.locate(at, at + 9)
        return {"text": "4242" in t, "sheet names": "Costs" in [h for _, _, h in doc.headings],
                "header with every row": "Units sold" in _line_with(t, "Fjordland"), "row numbers": loc.rows == (502, 502)}
    order = [t.index(f"Paragraph {n}.0.") for n in range(1, 9)]
    return {"spine order": order == sorted(order), "chapter of a passage": doc.locate(order[4], order[4] + 5).chapter == 5}


def checks_markitdown(converter, suffix: str, data: bytes) -> dict[str, bool]:
    import io

    t = converter.convert_stream(io.BytesIO(data), file_extension=suffix).text_content
    if suffix == ".docx":
        return {"text": "tide rises" in t, "headings": bool(re.search(r"^#+ Tides", t, re.M)),
                "header with every table row": "Depth" in _line_with(t, "Tromsø")}
    if suffix == ".pptx":
        before = t[: t.find("Body text 7")]
        return {"text": "Body text 12" in t, "notes": "Speaker note 5" in t,
                "slide of a passage": before.rfind("Slide number: 7") > before.rfind("Slide number: 6") >= 0}
    if suffix == ".xlsx":
        return {"text": "4242" in t, "sheet names": "Costs" in t,
                "header with every row": "Units sold" in _line_with(t, "Fjordland"), "row numbers": False}
    order = [t.find(f"Paragraph {n}.0.") for n in range(1, 9)]
    return {"spine order": min(order) >= 0 and order == sorted(order), "chapter of a passage": False}


def timed(fn, data: bytes, repeats: int = 20) -> float:
    """Median milliseconds of ``fn(data)``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(data)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markitdown", help="folder markitdown is installed in (pip install --target)")
    args = parser.parse_args()
    converter = None
    if args.markitdown:
        sys.path.insert(0, args.markitdown)
        from markitdown import MarkItDown

        converter = MarkItDown()
    print("| format | library | fidelity | ms per file |")
    print("|---|---|---|---|")
    for suffix, make in SAMPLES.items():
        data = make()
        ours = checks_ours(suffix, data)
        ms = timed(lambda d: load_document("x" + suffix, suffix, d), data)
        print(f"| {suffix} | ours | {sum(ours.values())}/{len(ours)}: {', '.join(k for k, v in ours.items() if v)} | {ms:.1f} |")
        if converter is not None:
            try:
                theirs = checks_markitdown(converter, suffix, data)
                ms = timed(lambda d: checks_markitdown(converter, suffix, d), data)
                missing = ", ".join(k for k, v in theirs.items() if not v) or "nothing"
                print(f"| {suffix} | markitdown | {sum(theirs.values())}/{len(theirs)}: missing {missing} | {ms:.1f} |")
            except Exception as exc:  # noqa: BLE001 - a converter that fails is a row of the table
                print(f"| {suffix} | markitdown | fails: {type(exc).__name__}: {exc} | - |")


if __name__ == "__main__":
    main()
