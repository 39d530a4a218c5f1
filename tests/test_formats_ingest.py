"""Documents as people keep them, ingested with the real embedder, FAISS and
SQLite: Word, PowerPoint, Excel, CSV, EPUB and code are indexed, a question
finds the right table cell, slide, sheet rows or function, every bad input
is one line of the report, and nothing indexed before is lost."""

from __future__ import annotations

import json

import pytest

from rag.ingest.formats.ocr import ocr_problem
from tests.support import samples
from tests.support.mixed import check_folder, write_mixed_folder

TOOLS = '''"""Conversions for the harbour office."""


def berth_fee(length_m):
    """The daily fee of a berth, in euros, for a ship of this length."""
    return 3 * length_m


def knots_to_kmh(knots):
    """Convert a ship's speed from knots to kilometres per hour."""
    return knots * 1.852
'''


def _office_folder(root):
    files = {
        "report.docx": samples.make_docx(
            "Harbour report", [("Tides", ["The tide rises at dawn and falls at noon. " * 4])],
            [["Port", "Depth", "Berths"], ["Oslo", "12 m", "40"], ["Tromsø", "9 m", "22"]]),
        "deck.pptx": samples.make_pptx([("Welcome", "Agenda: safety, budget, questions", "Greet the board"),
                                        ("Budget", "The council gives 4 million euros to resurfacing roads", ""),
                                        ("Questions", "Ask anything", "")]),
        "sales.xlsx": samples.make_xlsx({"Sales": [["Region", "Units sold"]] + [[f"District {i}", i * 7] for i in range(1, 30)]
                                         + [["Fjordland", 4242]]}),
        "cities.csv": samples.make_csv([["City", "Founded"], ["Bergen", "1070"], ["Trondheim", "997"]]),
        "voyage.epub": samples.make_epub("The Voyage", [("Departure", ["They left the quay at dawn."]),
                                                        ("Storm", ["A squall tore the mainsail in two."])]),
        "tools.py": TOOLS.encode(),
    }
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def _top(run, index, query, source):
    found = json.loads(run("search", query, "--index", index, "-k", "3", "--json").stdout)["results"]
    assert found and found[0]["source"] == source, [(r["source"], r["text"][:60]) for r in found]
    return found[0]


def test_office_books_sheets_and_code_are_indexed_with_their_locations(run, tmp_path):
    folder = _office_folder(tmp_path / "docs")
    index = tmp_path / "index"
    result = run("ingest", folder, "--index", index)
    assert result.exit_code == 0, result.output
    assert "added 6, updated 0, removed 0, skipped 0, failed 0" in result.stderr
    cell = _top(run, index, "How deep is the port of Tromsø?", "report.docx")
    assert "Port: Tromsø; Depth: 9 m" in cell["text"] and cell["context"].startswith("Harbour report")
    slide = _top(run, index, "How much money goes to resurfacing roads?", "deck.pptx")
    assert slide["location"] == {"slide": 2} and "Harbour" not in slide["text"]
    rows = _top(run, index, "How many units did Fjordland sell?", "sales.xlsx")
    assert rows["location"]["sheet"] == "Sales" and "Region: Fjordland; Units sold: 4242" in rows["text"]
    first, last = rows["location"]["rows"]
    assert first <= 31 <= last  # Fjordland is on row 31
    code = _top(run, index, "Which function converts knots to kilometres per hour?", "tools.py")
    first, last = code["location"]["lines"]
    assert first <= TOOLS.splitlines().index("def knots_to_kmh(knots):") + 1 <= last
    book = _top(run, index, "What tore the mainsail?", "voyage.epub")
    assert book["location"] == {"chapter": 2}
    shown = run("search", "resurfacing roads", "--index", index, "-k", "1")
    assert "deck.pptx, slide 2" in shown.stdout


def test_types_it_cannot_read_are_counted_and_an_empty_run_says_why(run, tmp_path):
    folder = tmp_path / "only-pictures"
    folder.mkdir()
    for name in ("a.png", "b.png", "c.exe"):
        (folder / name).write_bytes(b"\x89PNG")
    result = run("ingest", folder, "--index", tmp_path / "index")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not read: 2 .png, 1 .exe" in result.stderr
    assert "nothing indexed" in result.stderr and "types rag-budget cannot read" in result.stderr
    report = json.loads(run("ingest", folder, "--index", tmp_path / "index", "--json").stdout)
    assert report["unsupported"] == {".exe": 1, ".png": 2} and report["nothing_indexed"].startswith("nothing indexed")


def test_a_mixed_folder_with_bad_inputs_is_reported_line_by_line(pipeline_factory, tmp_path, monkeypatch):
    from rag.ingest.formats import sheets

    monkeypatch.setattr(sheets, "MAX_ROWS", 100)  # the million-row file is the bench's; the bound is the same code
    folder = write_mixed_folder(tmp_path / "docs", 20)
    (folder.root / "bad" / "long.csv").write_bytes(samples.make_csv([["n", "square"]] + [[i, i * i] for i in range(300)]))
    folder.bad["bad/long.csv"] = "only the first 100 rows were read"
    pipeline = pipeline_factory(tmp_path / "index")
    checks = check_folder(pipeline, folder)
    assert checks["bad_unreported"] == [] and checks["bad_misreported"] == [] and checks["good_not_found"] == []
    assert checks["vanished_reported"] and checks["unsupported"] == {".exe": 1, ".png": 1}
    assert checks["files_indexed"] == len(folder.good) + 1 + (ocr_problem() is None)  # long.csv in part; the scan with OCR
    before = {h.chunk_id for h in pipeline.search(folder.good["good/docx/berth-0004.docx"][1], k=3, mode="bm25")}
    # A file already indexed turns unreadable: reported, and its chunks stay.
    target = folder.root / "good" / "docx" / "berth-0004.docx"
    target.write_bytes(samples.encrypted_office(target.read_bytes()))
    again = pipeline.ingest([folder.root])
    assert dict(again.failed)["good/docx/berth-0004.docx"].startswith("password-protected")
    assert not again.removed or "good/docx/berth-0004.docx" not in again.removed
    after = {h.chunk_id for h in pipeline.search(folder.good["good/docx/berth-0004.docx"][1], k=3, mode="bm25")}
    assert before and before == after


def test_the_command_line_reports_bad_files_without_a_traceback(run, tmp_path):
    folder = write_mixed_folder(tmp_path / "docs", 10)
    result = run("ingest", folder.root, "--index", tmp_path / "index")
    assert result.exit_code == 1 and "Traceback" not in result.output
    for source, fragment in folder.bad.items():
        line = next((l for l in result.stderr.splitlines() if source in l), "")
        read_by_ocr = fragment == "scanned" and line.startswith("partly:") and "read with OCR" in line
        assert line.startswith("failed:") or read_by_ocr, (source, result.stderr)


def test_headings_are_searched_but_prompts_keep_the_chunk_text(pipeline_factory, tmp_path):
    filler = " ".join(f"Paragraph about soil, light and seasons number {i}." for i in range(40))
    docs = tmp_path / "garden"
    docs.mkdir()
    (docs / "tomatoes.md").write_text(f"# Tomato growing\n\n{filler}\n\n## Watering\n\nGive each plant two litres a day.\n")
    (docs / "cacti.md").write_text(f"# Cactus care\n\n{filler}\n\n## Watering\n\nWater once a month in summer.\n")
    pipeline = pipeline_factory(tmp_path / "index")
    pipeline.ingest([docs], chunk_tokens=64, overlap_tokens=8)
    hit = pipeline.search("how often to water a tomato plant", k=1, mode="bm25")[0]
    assert hit.source == "tomatoes.md" and "two litres" in hit.text
    assert hit.context == "Tomato growing > Watering" and "Tomato growing" not in hit.text


@pytest.mark.skipif(ocr_problem() is not None, reason="OCR needs the ocr extra and Tesseract (apt-get install tesseract-ocr)")
def test_a_scanned_pdf_is_read_with_ocr(pipeline_factory, tmp_path):
    docs = tmp_path / "scans"
    docs.mkdir()
    (docs / "log.pdf").write_bytes(samples.scanned_pdf(["The harbour master closed", "berth nine for repairs"]))
    pipeline = pipeline_factory(tmp_path / "index")
    report = pipeline.ingest([docs])
    assert report.added == ["log.pdf"] and "read with OCR" in report.warnings[0][1]
    hit = pipeline.search("which berth was closed for repairs", k=1)[0]
    assert hit.source == "log.pdf" and hit.page == 1 and "repairs" in hit.text.lower()


def test_without_ocr_a_scanned_pdf_says_how_many_pages_and_what_to_install(pipeline_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_TESSERACT", str(tmp_path / "no-tesseract-here"))
    docs = tmp_path / "scans"
    docs.mkdir()
    (docs / "log.pdf").write_bytes(samples.scanned_pdf(["Closed for repairs"]))
    (docs / "mixed.pdf").write_bytes(_text_then_scan())
    report = pipeline_factory(tmp_path / "index").ingest([docs])
    problem = dict(report.failed)["log.pdf"]
    assert "scanned PDF: 1 page" in problem and "apt-get install tesseract-ocr" in problem
    assert report.added == ["mixed.pdf"]
    assert "1 of 2 pages are scanned images" in dict(report.warnings)["mixed.pdf"]


def _text_then_scan() -> bytes:
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for data in (samples.make_pdf(["A page with real text about ferries."]), samples.scanned_pdf(["A scan"])):
        writer.append(PdfReader(io.BytesIO(data)))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
