"""Reading every format from files the usual libraries write (python-docx,
python-pptx, openpyxl; an EPUB is a zip): text, locations and outline, and
one clear line for each bad input."""

from __future__ import annotations

import pytest

from rag.errors import DocumentError
from rag.ingest.chunking import Chunker
from rag.ingest.formats import Location, LoadedDocument, family_of, load_document
from rag.ingest.formats import sheets
from rag.ingest.formats.code import python_outline
from rag.ingest.formats.text import clean_heading, find_headings
from tests.support import samples


def _chunks(doc: LoadedDocument, size: int = 40):
    # Words stand in for tokens: these tests are about locations, not sizes.
    from rag.ingest.chunking import ChunkerSettings

    return Chunker(lambda t: len(t.split()), ChunkerSettings(size, 4)).split(doc)


def test_docx_keeps_paragraphs_headings_and_table_cells_with_their_headers():
    data = samples.make_docx("Harbour report", [("Tides", ["The tide rises at dawn."]), ("Boats", ["Ferries leave hourly."])],
                             [["Port", "Depth", "Berths"], ["Oslo", "12 m", "40"], ["Bergen", "9 m", "22"]])
    doc = load_document("r.docx", ".docx", data)
    assert doc.title == "Harbour report"
    assert [h for _, _, h in doc.headings] == ["Harbour report", "Tides", "Boats", "Figures"]
    assert "Port: Bergen; Depth: 9 m; Berths: 22" in doc.text
    assert doc.context(doc.text.index("Bergen")) == "Harbour report > Figures"
    assert doc.context(doc.text.index("tide rises")) == "Harbour report > Tides"


def test_pptx_gives_each_chunk_its_slide_and_reads_the_notes():
    data = samples.make_pptx([("Welcome", "Agenda for the day", "Greet the board"),
                              ("Budget", "Roads get 4 million euros", "Stress the bridges")])
    doc = load_document("deck.pptx", ".pptx", data)
    chunks = _chunks(doc)
    by_slide = {c.location.slide: c for c in chunks}
    assert set(by_slide) == {1, 2}
    assert "Roads get 4 million" in by_slide[2].text and "Notes: Stress the bridges" in by_slide[2].text
    assert by_slide[2].context == "Budget" and by_slide[1].location.label() == "slide 1"


def test_xlsx_repeats_column_headers_and_knows_sheet_and_rows():
    rows = [["Region", "Units", "Price"]] + [[f"Region {i}", i * 10, 2.5] for i in range(1, 41)]
    data = samples.make_xlsx({"Sales": rows, "Costs": [["Item", "EUR"], ["Rent", 900.0]]})
    doc = load_document("book.xlsx", ".xlsx", data)
    chunks = _chunks(doc, size=60)
    sales = [c for c in chunks if c.location.sheet == "Sales"]
    assert len(sales) > 1
    for c in sales:
        assert c.text.count("Units:") >= 1  # every chunk says what its numbers are
    hit = next(c for c in chunks if "Region 33;" in c.text)
    first, last = hit.location.rows
    assert first <= 34 <= last  # Region 33 is on row 34, under the header row
    costs = next(c for c in chunks if c.location.sheet == "Costs")
    assert "Item: Rent; EUR: 900" in costs.text and costs.location.rows == (1, 2) and costs.context == "Costs"


def test_csv_with_semicolons_and_a_row_limit(monkeypatch):
    data = "City;Population\nOslo;700000\nLima;10000000\n".encode()
    doc = load_document("cities.csv", ".csv", data)
    assert "City: Lima; Population: 10000000" in doc.text
    monkeypatch.setattr(sheets, "MAX_ROWS", 50)
    many = load_document("many.csv", ".csv", samples.make_csv([["n", "square"]] + [[i, i * i] for i in range(500)]))
    assert len(many.text.splitlines()) == 50
    assert any("only the first 50 rows were read" in w for w in many.warnings)


def test_epub_chapters_follow_the_spine_not_the_zip_order():
    data = samples.make_epub("The Voyage", [("Departure", ["They left at dawn."]), ("Storm", ["The mast broke."]),
                                            ("Arrival", ["Land at last."])])
    doc = load_document("book.epub", ".epub", data)
    assert doc.text.index("left at dawn") < doc.text.index("mast broke") < doc.text.index("Land at last")
    chunks = _chunks(doc)
    storm = next(c for c in chunks if "mast broke" in c.text)
    assert storm.location == Location(chapter=2) and storm.context == "The Voyage > Storm"
    assert doc.text.count("Storm") == 1  # the chapter's <title> is not repeated


def test_code_is_split_along_definitions_with_line_spans():
    lines = ['"""Tools."""', "", ""]
    for n in range(6):
        lines += [f"def tool_{n}(x):", f'    """Tool {n} doubles the harbour fee {n}."""', "    return x * 2", "", ""]
    lines += ["class Crane:", '    """A crane."""', "", "    def lift(self, load):", '        """Lift the load."""',
              "        return load"]
    source = "\n".join(lines) + "\n"
    doc = load_document("pkg/tools.py", ".py", source.encode())
    assert doc.language == "python" and doc.title == "tools.py"
    chunks = _chunks(doc, size=20)
    for c in chunks:
        first, last = c.location.lines
        assert source.splitlines()[first - 1].strip() == c.text.splitlines()[0].strip()
        assert last - first == c.text.count("\n")
    fee = next(c for c in chunks if "harbour fee 3" in c.text)
    assert fee.context == "tools.py > def tool_3"
    assert next(c for c in chunks if "Lift the load" in c.text).context.startswith("tools.py > class Crane")


def test_outlines_of_rst_markdown_and_python():
    rst = ":mod:`bisect` --- Array bisection\n==================================\n\nIntro.\n\n" \
          "Searching Sorted Lists\n----------------------\n\nText.\n\n--------------\n\nAfter a transition.\n"
    assert [(lvl, h) for _, lvl, h in find_headings(rst, markdown=False)] == [
        (1, "bisect — Array bisection"), (2, "Searching Sorted Lists")]
    md = "# Top\n\n```\n# not a heading\n```\n\n## Sub\n\ntext\n"
    assert [(lvl, h) for _, lvl, h in find_headings(md, markdown=True)] == [(1, "Top"), (2, "Sub")]
    doc = load_document("a.rst", ".rst", rst.encode())
    assert doc.context(rst.index("Text.")) == "bisect — Array bisection > Searching Sorted Lists"
    assert clean_heading("``os.path`` --- Common *pathname* manipulations") == "os.path — Common pathname manipulations"
    assert [h for _, _, h in python_outline("class A:\n    def f(self):\n        pass\n")] == ["class A", "def f"]
    assert python_outline("def broken(:\n") == ()


def test_html_headings_and_title_make_the_context():
    doc = load_document("p.html", ".html", b"<title>Guide</title><h1>Install</h1><p>Run it.</p><h2>Linux</h2><p>apt.</p>")
    assert doc.context(doc.text.index("apt")) == "Guide > Install > Linux"


def test_locations_round_trip_and_read_as_people_cite_them():
    for loc, label in [(Location(page=3), "p.3"), (Location(slide=2), "slide 2"),
                       (Location(sheet="Q1", rows=(2, 9)), "sheet Q1, rows 2-9"), (Location(chapter=4), "chapter 4"),
                       (Location(lines=(10, 10)), "line 10"), (Location(), "")]:
        assert loc.label() == label
        assert Location.from_dict(loc.to_dict()) == loc
    assert Location.from_dict({"page": "x", "rows": [1]}) == Location()


def test_families_by_suffix():
    assert [family_of(s) for s in (".DOCX", ".pptx", ".xlsx", ".csv", ".epub", ".py", ".ts", ".md", ".png")] == [
        "docx", "pptx", "xlsx", "csv", "epub", "code", "code", "text", None]


@pytest.mark.parametrize("name, make, problem", [
    ("locked.docx", lambda: samples.encrypted_office(samples.make_docx("S", [("A", ["b"])])), "password-protected"),
    ("locked.xlsx", lambda: samples.encrypted_office(samples.make_xlsx({"S": [["a"], [1]]})), "password-protected"),
    ("locked.pptx", lambda: samples.encrypted_office(samples.make_pptx([("T", "b", "")])), "password-protected"),
    ("locked.pdf", lambda: samples.encrypted_pdf(["secret"]), "encrypted PDF"),
    ("cut.docx", lambda: samples.make_docx("S", [("A", ["b"])])[:3000], "corrupt .docx"),
    ("junk.pptx", lambda: b"PK\x03\x04not really", "corrupt .pptx"),
    ("bomb.xlsx", lambda: samples.zip_bomb(300 << 20), "zip bomb"),
    ("bomb.docx", lambda: samples.zip_bomb(300 << 20), "zip bomb"),
    ("empty.epub", lambda: samples.make_epub("Nothing", []), "no text"),
    ("odd.xlsx", lambda: _zip({"hello.txt": b"not a workbook"}), "cannot read this .xlsx"),
    ("drm.epub", lambda: _with_drm(samples.make_epub("Locked", [("One", ["Text."])])), "DRM"),
    ("bad.py", lambda: b"\x00\x01binary", "binary"),
])
def test_bad_input_is_one_line_naming_the_file(name, make, problem):
    with pytest.raises(DocumentError) as info:
        load_document(name, "." + name.rsplit(".", 1)[1], make())
    message = str(info.value)
    assert message.startswith(name + ":") and problem in message and "\n" not in message


def test_many_zip_entries_are_refused_before_reading():
    with pytest.raises(DocumentError, match="entries, over the limit"):
        load_document("many.docx", ".docx", _zip({f"word/part{i}.xml": b"" for i in range(10_001)}))


def _with_drm(book: bytes) -> bytes:
    import io
    import zipfile

    out = io.BytesIO(book)
    with zipfile.ZipFile(out, "a") as z:
        z.writestr("META-INF/encryption.xml", '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                   'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData>'
                   '<enc:CipherReference URI="OEBPS/ch1.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')
    return out.getvalue()


def _zip(entries: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()
