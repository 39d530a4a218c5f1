"""Sample documents of every format rag-budget reads, written by the same
libraries people's tools use (python-docx, python-pptx, openpyxl; an EPUB is
a zip), and the bad inputs an ingest must survive: password-protected
Office files and PDFs, corrupt and bomb zips, a million-row spreadsheet,
scanned pages. For the tests and ``python -m tests.tools.bench_formats``.

Does not: ingest anything.
"""

from __future__ import annotations

import io
import zipfile
from typing import Sequence


def make_pdf(pages: Sequence[str]) -> bytes:
    """A PDF with one page per string, each line of it drawn in Helvetica."""
    objects: list[bytes] = []
    n_pages = len(pages)
    page_ids = [4 + 2 * i for i in range(n_pages)]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{i} 0 R" for i in page_ids).encode()
    objects.append(b"<< /Type /Pages /Kids [" + kids + b"] /Count " + str(n_pages).encode() + b" >>")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        lines = []
        for line in text.split("\n"):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            lines.append(f"({escaped}) Tj 0 -16 Td")
        stream = ("BT /F1 12 Tf 72 720 Td " + " ".join(lines) + " ET").encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {page_ids[i] + 1} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def make_docx(title: str, sections: Sequence[tuple[str, Sequence[str]]],
              table: Sequence[Sequence[str]] | None = None) -> bytes:
    """A Word document: a Title paragraph, then each ``(heading,
    paragraphs)`` as a Heading 1 and its paragraphs, then ``table`` (first
    row the header) under a heading of its own."""
    import docx

    document = docx.Document()
    document.core_properties.title = title
    document.add_heading(title, level=0)
    for heading, paragraphs in sections:
        document.add_heading(heading, level=1)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
    if table:
        document.add_heading("Figures", level=1)
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_pptx(slides: Sequence[tuple[str, str, str]]) -> bytes:
    """A presentation of ``(title, body, notes)`` slides."""
    import pptx

    deck = pptx.Presentation()
    layout = deck.slide_layouts[1]  # title and content
    for title, body, notes in slides:
        slide = deck.slides.add_slide(layout)
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def make_xlsx(sheets: dict[str, Sequence[Sequence[object]]]) -> bytes:
    """A workbook of ``{sheet name: rows}`` (first row the header)."""
    import openpyxl

    book = openpyxl.Workbook()
    book.remove(book.active)
    for name, rows in sheets.items():
        sheet = book.create_sheet(name)
        for row in rows:
            sheet.append(list(row))
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def make_csv(rows: Sequence[Sequence[object]]) -> bytes:
    """CSV text of ``rows`` (first row the header)."""
    import csv

    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue().encode("utf-8")


def make_epub(title: str, chapters: Sequence[tuple[str, Sequence[str]]]) -> bytes:
    """An EPUB 3 book of ``(chapter title, paragraphs)`` chapters, in order."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")  # stored first, uncompressed
        book.writestr("META-INF/container.xml", (
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
            '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>"))
        items, refs = [], []
        # Written in reverse so that the spine, not the zip order, decides the reading order.
        for n in reversed(range(len(chapters))):
            name, paragraphs = chapters[n]
            body = "".join(f"<p>{p}</p>" for p in paragraphs)
            book.writestr(f"OEBPS/ch{n + 1}.xhtml", (
                '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
                f"<head><title>{name}</title></head><body><h1>{name}</h1>{body}</body></html>"))
        for n in range(len(chapters)):
            items.append(f'<item id="c{n + 1}" href="ch{n + 1}.xhtml" media-type="application/xhtml+xml"/>')
            refs.append(f'<itemref idref="c{n + 1}"/>')
        book.writestr("OEBPS/content.opf", (
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
            f'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{title}</dc:title>'
            '<dc:identifier id="id">sample</dc:identifier></metadata>'
            f"<manifest>{''.join(items)}</manifest><spine>{''.join(refs)}</spine></package>"))
    return out.getvalue()


# -- bad inputs ----------------------------------------------------------------


def encrypted_office(data: bytes, password: str = "secret") -> bytes:
    """``data`` (a .docx, .xlsx or .pptx) protected with ``password`` as
    Office does it (msoffcrypto-tool, in the test extra)."""
    from msoffcrypto.format.ooxml import OOXMLFile

    out = io.BytesIO()
    OOXMLFile(io.BytesIO(data)).encrypt(password, out)
    return out.getvalue()


def encrypted_pdf(pages: Sequence[str], password: str = "secret") -> bytes:
    """A PDF that needs ``password`` to open."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(pages))))
    writer.encrypt(password)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def zip_bomb(expanded_bytes: int = 1 << 30) -> bytes:
    """A small zip whose one entry expands to ``expanded_bytes`` of zeros."""
    out = io.BytesIO()
    block = bytes(1 << 20)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as bomb:
        with bomb.open("xl/worksheets/sheet1.xml", "w", force_zip64=True) as entry:
            for _ in range(expanded_bytes // len(block)):
                entry.write(block)
    return out.getvalue()


def many_rows_xlsx(rows: int) -> bytes:
    """A one-sheet workbook of ``rows`` data rows under a header, written
    row by row (XlsxWriter, which python-pptx installs)."""
    import xlsxwriter

    out = io.BytesIO()
    book = xlsxwriter.Workbook(out, {"constant_memory": True, "in_memory": True})
    sheet = book.add_worksheet("Readings")
    sheet.write_row(0, 0, ["Sensor", "Reading", "Unit"])
    for r in range(1, rows + 1):
        sheet.write_row(r, 0, [f"S{r % 97}", r % 1000, "kPa"])
    book.close()
    return out.getvalue()


def scanned_pdf(lines: Sequence[str]) -> bytes:
    """A one-page PDF that is only an image of ``lines`` of text, as a
    scanner makes it (no text layer), drawn with Pillow."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (1700, 400 + 90 * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=56)
    for n, line in enumerate(lines):
        draw.text((120, 150 + 90 * n), line, fill=0, font=font)
    out = io.BytesIO()
    image.save(out, format="PDF", resolution=200.0)
    return out.getvalue()
