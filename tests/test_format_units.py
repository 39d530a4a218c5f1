"""Each reader yields the document's own units (issue 54): Word and
PowerPoint headings, list items, table rows and sentences; a sheet's rows;
a PDF's pages under its outline's headings; a code file's lines under their
definition; an EPUB's chapters' units where the chapter lies in the book."""

from __future__ import annotations

import io
import time

from rag.ingest.formats import LoadedDocument, load_document
from rag.ingest.formats import epub as epub_module
from rag.ingest.formats.document import Unit
from rag.ingest.formats.pdf import _outline_units
from tests.support import samples
from tests.unit_contract import checked_units


_units = checked_units


def _docx() -> bytes:
    import docx

    document = docx.Document()
    document.core_properties.title = "Guide"
    document.add_heading("Guide", level=0)
    document.add_heading("Install", level=1)
    document.add_paragraph("Run the installer. It takes e.g. two minutes! Then reboot.")
    document.add_paragraph("Download it", style="List Bullet")
    document.add_paragraph("Unpack it. Then run it.", style="List Number")
    numbered = document.add_paragraph("Numbered by hand. Two sentences.")  # Normal style, its own numPr
    numbered._p.get_or_add_pPr().get_or_add_numPr().get_or_add_numId().val = 1
    unnumbered = document.add_paragraph("Numbering taken off. Two sentences.")
    unnumbered._p.get_or_add_pPr().get_or_add_numPr().get_or_add_numId().val = 0
    document.add_heading("Ports", level=2)
    table = document.add_table(rows=3, cols=2)
    for r, row in enumerate([["Service", "Port"], ["VNC", "5900"], ["Webmin", "10000"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_headings_list_items_rows_and_sentences():
    doc = load_document("g.docx", ".docx", _docx())
    assert _units(doc) == [
        ("heading", "Guide", ""),  # a heading is about its parent heading
        ("heading", "Install", "Guide"),
        ("text", "Run the installer.", "Install"),
        ("text", "It takes e.g. two minutes!", "Install"),
        ("text", "Then reboot.", "Install"),
        ("item", "Download it", "Install"),
        ("item", "Unpack it. Then run it.", "Install"),
        ("item", "Numbered by hand. Two sentences.", "Install"),
        ("text", "Numbering taken off.", "Install"),
        ("text", "Two sentences.", "Install"),
        ("heading", "Ports", "Install"),
        ("row", "Service | Port", "Ports"),
        ("row", "Service: VNC; Port: 5900", "Ports"),
        ("row", "Service: Webmin; Port: 10000", "Ports"),
    ]


def test_docx_sample_text_is_unchanged_and_rows_carry_their_headers():
    data = samples.make_docx("Harbour report", [("Tides", ["The tide rises at dawn."])],
                             [["Port", "Depth"], ["Oslo", "12 m"]])
    doc = load_document("r.docx", ".docx", data)
    assert doc.text == ("Harbour report\n\nTides\n\nThe tide rises at dawn.\n\nFigures\n\nPort | Depth\n"
                        "Port: Oslo; Depth: 12 m")
    assert ("row", "Port: Oslo; Depth: 12 m", "Figures") in _units(doc)


def test_pptx_title_bullets_long_paragraph_table_and_notes():
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Budget"
    long = "Roads get four million euros this year. " * 8
    slide.placeholders[1].text = "Roads first\nBridges second. Then tunnels.\n" + long.strip()
    grid = slide.shapes.add_table(2, 2, Inches(1), Inches(5), Inches(4), Inches(1)).table
    for r, row in enumerate([["Item", "EUR"], ["Roads", "4m"]]):
        for c, value in enumerate(row):
            grid.cell(r, c).text = value
    slide.notes_slide.notes_text_frame.text = "Stress the bridges. Mention tunnels."
    untitled = deck.slides.add_slide(deck.slide_layouts[6])  # blank: no title
    box = untitled.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    box.text_frame.text = "A lone box"
    out = io.BytesIO()
    deck.save(out)
    doc = load_document("d.pptx", ".pptx", out.getvalue())
    assert "Notes: Stress the bridges. Mention tunnels." in doc.text
    assert _units(doc) == [
        ("heading", "Budget", ""),
        ("item", "Roads first", "Budget"),
        ("item", "Bridges second. Then tunnels.", "Budget"),
        *[("text", "Roads get four million euros this year.", "Budget")] * 8,
        ("row", "Item | EUR", "Budget"),
        ("row", "Item: Roads; EUR: 4m", "Budget"),
        ("text", "Stress the bridges.", "Budget"),
        ("text", "Mention tunnels.", "Budget"),
        ("heading", "Slide 2", ""),
        ("item", "A lone box", "Slide 2"),
    ]


def test_pptx_sample_units_follow_their_slides():
    data = samples.make_pptx([("Welcome", "Agenda for the day", "Greet the board"),
                              ("Budget", "Roads get 4 million euros", "")])
    doc = load_document("deck.pptx", ".pptx", data)
    assert _units(doc) == [("heading", "Welcome", ""), ("item", "Agenda for the day", "Welcome"),
                           ("text", "Greet the board", "Welcome"), ("heading", "Budget", ""),
                           ("item", "Roads get 4 million euros", "Budget")]
    assert doc.page_at(doc.units[-1].start) is None and doc.segment_at(doc.units[-1].start).location.slide == 2


def test_xlsx_and_csv_rows_about_their_sheet():
    data = samples.make_xlsx({"Sales": [["Region", "Units"], ["North", 3], [None, None], ["South", 4]],
                              "Costs": [["Item", "EUR"], ["Rent", 900.0]]})
    doc = load_document("b.xlsx", ".xlsx", data)
    assert _units(doc) == [("row", "Region | Units", "Sales"), ("row", "Region: North; Units: 3", "Sales"),
                           ("row", "Region: South; Units: 4", "Sales"), ("row", "Item | EUR", "Costs"),
                           ("row", "Item: Rent; EUR: 900", "Costs")]
    assert len(doc.units) == len(doc.text.splitlines())
    csv_doc = load_document("c.csv", ".csv", b"City;Pop\nOslo;700\nLima;10000000\n")
    assert _units(csv_doc) == [("row", "City | Pop", ""), ("row", "City: Oslo; Pop: 700", ""),
                               ("row", "City: Lima; Pop: 10000000", "")]


def test_epub_chapter_units_lie_where_the_chapter_does():
    data = samples.make_epub("Voyage", [("Departure", ["They left at dawn. The sea was calm."]),
                                        ("Storm", ["The mast broke."])])
    doc = load_document("b.epub", ".epub", data)
    # A chapter's heading is about its parent (none) as the HTML reader says,
    # or about itself where that reader gives no units (split as prose).
    assert [(kind, text) for kind, text, _ in _units(doc)] == [
        ("heading", "Departure"), ("text", "They left at dawn."), ("text", "The sea was calm."), ("heading", "Storm"),
        ("text", "The mast broke.")]
    assert [about for kind, _, about in _units(doc) if kind != "heading"] == ["Departure", "Departure", "Storm"]


def test_epub_without_units_from_the_html_reader_splits_each_chapter_as_prose(monkeypatch):
    parse = epub_module.parse_html

    def without_units(html: str, **kw) -> LoadedDocument:
        chapter = parse(html, **kw)
        return LoadedDocument(chapter.text, title=chapter.title, headings=chapter.headings)

    monkeypatch.setattr(epub_module, "parse_html", without_units)
    data = samples.make_epub("Voyage", [("Departure", ["They left at dawn. The sea was calm."]),
                                        ("Storm", ["The mast broke."])])
    doc = load_document("b.epub", ".epub", data)
    # A heading is about the heading above it (none here: both chapters are at the top level).
    assert _units(doc) == [("heading", "Departure", ""), ("text", "They left at dawn.", "Departure"),
                           ("text", "The sea was calm.", "Departure"), ("heading", "Storm", ""),
                           ("text", "The mast broke.", "Storm")]


def test_epub_keeps_the_units_the_html_reader_gives(monkeypatch):
    # The HTML reader's own units (a definition, say), relative to each
    # chapter's text, are moved to where the chapter starts in the book; one
    # about nothing is about the chapter.
    parse = epub_module.parse_html

    def with_units(html: str, **kw) -> LoadedDocument:
        chapter = parse(html, **kw)
        at = chapter.text.index("\n\n") + 2
        end = chapter.text.index(".", at) + 1
        return LoadedDocument(chapter.text, title=chapter.title, headings=chapter.headings,
                              units=(Unit(at, end, "definition", ""), Unit(end + 1, len(chapter.text) + 5, "text", "x")))

    monkeypatch.setattr(epub_module, "parse_html", with_units)
    data = samples.make_epub("Voyage", [("Departure", ["They left at dawn. The sea was calm."]),
                                        ("Storm", ["The mast broke. Then the sail."])])
    doc = load_document("b.epub", ".epub", data)
    # the unit past its chapter's end is left out
    assert _units(doc) == [("definition", "They left at dawn.", "Departure"),
                           ("definition", "The mast broke.", "Storm")]


def _pdf_with_outline() -> bytes:
    from pypdf import PdfReader, PdfWriter

    data = samples.make_pdf(["1 Harbour\nThe tide rises at dawn and falls at noon on every day of the year.",
                             "2.1 Boats\nFerries leave hourly from the north pier all through the summer season.",
                             "Introductory remarks on the tides are made here in more than a few words."])
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    top = writer.add_outline_item(title="Harbour", page_number=0)
    writer.add_outline_item(title="Boats", page_number=1, parent=top)
    writer.add_outline_item(title="Not in the text", page_number=1, parent=top)
    writer.add_outline_item(title="Intro", page_number=2)  # "Introductory" is not it
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_pdf_outline_gives_headings_and_what_each_page_is_about():
    doc = load_document("h.pdf", ".pdf", _pdf_with_outline())
    starts = dict(doc.page_starts)
    assert doc.headings == ((0, 1, "Harbour"), (starts[2], 2, "Boats"),
                            (doc.text.index("Ferries") - 1, 2, "Not in the text"), (starts[3], 1, "Intro"))
    assert _units(doc) == [
        ("heading", "1 Harbour", ""),
        ("text", "The tide rises at dawn and falls at noon on every day of the year.", "Harbour"),
        ("heading", "2.1 Boats", "Harbour"),
        ("text", "Ferries leave hourly from the north pier all through the summer season.", "Not in the text"),
        ("text", "Introductory remarks on the tides are made here in more than a few words.", "Intro"),
    ]
    assert doc.context(doc.text.index("Ferries")) == "Harbour > Not in the text"


def test_pdf_without_outline_is_its_pages_prose():
    first = "The tide rises at dawn and falls at noon, they say. Boats wait for it in the harbour all day long."
    doc = load_document("p.pdf", ".pdf", samples.make_pdf([first, "Ferries leave hourly."]))
    assert doc.headings == ()
    assert _units(doc) == [("text", "The tide rises at dawn and falls at noon, they say.", ""),
                           ("text", "Boats wait for it in the harbour all day long.", ""),
                           ("text", "Ferries leave hourly.", "")]


def test_pdf_outline_search_is_bounded():
    # Thousands of bookmarks whose titles are nowhere on a long page cost a
    # few times the text, not the bookmarks times the page.
    text = "x x x " * 100_000
    outline = [(1, 1, f"x x x x q{i}") for i in range(5_000)]
    began = time.perf_counter()
    headings, units = _outline_units(text, [(1, 0)], outline)
    assert time.perf_counter() - began < 2
    assert len(headings) == 5_000 and all(at == 0 for at, _, _ in headings)
    assert units and units[0].about == "x x x x q4999"


def test_code_lines_about_the_definition_enclosing_them():
    source = ('"""Tools."""\nimport os\n\n@cache\ndef double(x):\n    """Double x."""\n    # twice\n    return x * 2\n\n'
              "class Crane:\n    def lift(self):\n        pass\n    height = 1\n\nresult = double(1)\n")
    doc = load_document("t.py", ".py", source.encode())
    assert _units(doc) == [
        ("code", '"""Tools."""', ""), ("code", "import os", ""), ("code", "@cache", "def double"),
        ("code", "def double(x):", "def double"), ("code", '"""Double x."""', "def double"),
        ("code", "# twice", "def double"), ("code", "return x * 2", "def double"), ("code", "class Crane:", "class Crane"),
        ("code", "def lift(self):", "def lift"), ("code", "pass", "def lift"), ("code", "height = 1", "class Crane"),
        ("code", "result = double(1)", ""),
    ]
    js = load_document("t.js", ".js", b"function f() {\n  return 1;\n}\n")
    assert _units(js) == [("code", "function f() {", ""), ("code", "return 1;", "")]
    broken = load_document("b.py", ".py", b"def f(:\n    pass\n")  # does not parse: lines about nothing
    assert _units(broken) == [("code", "def f(:", ""), ("code", "pass", "")]
