"""Word (.docx) and PowerPoint (.pptx) documents.

A .docx gives its paragraphs and tables in reading order (python-docx);
paragraphs in a "Heading N" style are the outline, and each table row keeps
its column headers (``tables``). A .pptx gives each slide's text, tables and
speaker notes (python-pptx), one segment per slide, so every chunk knows its
slide; a slide's title heads it in the outline.

Does not: read legacy .doc/.ppt files, images, charts or embedded objects.
"""

from __future__ import annotations

import io
import re

from .containers import open_zip
from .document import Location, LoadedDocument, Segment, check_text
from .tables import cell_text, header_text, row_text

DOCX_SUFFIXES = frozenset({".docx"})
PPTX_SUFFIXES = frozenset({".pptx"})
_HEADING_STYLE = re.compile(r"heading\s*(\d)", re.IGNORECASE)


class _Builder:
    """Text assembled block by block, with heading offsets and segments;
    TextOverLimit at the first block that takes it over ``max_chars``, so
    the rest of the file is never read."""

    def __init__(self, max_chars: int | None = None) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.length = 0
        self.headings: list[tuple[int, int, str]] = []
        self.segments: list[Segment] = []

    def add(self, block: str, *, heading: int | None = None) -> None:
        block = block.strip()
        if not block:
            return
        if self.parts:
            self.parts.append("\n\n")
            self.length += 2
        if heading is not None:
            self.headings.append((self.length, heading, " ".join(block.split())))
        self.parts.append(block)
        self.length += len(block)
        check_text(self.length, self.max_chars)

    def segment(self, location: Location) -> None:
        """Start a new segment at the next block."""
        start = self.length + (2 if self.parts else 0)
        self.segments.append(Segment(start, location))

    def document(self, title: str | None) -> LoadedDocument:
        return LoadedDocument("".join(self.parts), tuple(self.segments), title=title or None,
                              headings=tuple(self.headings))


def table_rows(rows: list[list[str]]) -> list[str]:
    """A table's rows as lines: the first row as its header line, each
    other row as ``header: value`` pairs."""
    rows = [r for r in rows if any(r)]
    if not rows:
        return []
    headers = rows[0]
    return [header_text(headers)] + [row_text(headers, r) for r in rows[1:]]


def _docx_table(table) -> list[list[str]]:
    rows = []
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            if id(cell._tc) in seen:  # a merged cell is returned once per grid column
                continue
            seen.add(id(cell._tc))
            cells.append(cell_text(cell.text))
        rows.append(cells)
    return rows


def load_docx(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A Word document: paragraphs and tables in order, headings as the
    outline, the title from its properties or its Title paragraph;
    TextOverLimit at the first paragraph or table past ``max_chars``."""
    import docx
    from docx.table import Table

    open_zip(source, data, ".docx").close()
    document = docx.Document(io.BytesIO(data))
    out = _Builder(max_chars)
    title = (document.core_properties.title or "").strip()
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            out.add("\n".join(table_rows(_docx_table(block))))
            continue
        style = (block.style.name if block.style is not None else "") or ""
        level = _HEADING_STYLE.match(style)
        if style.lower() == "title":
            title = title or block.text.strip()
            out.add(block.text, heading=1)
        else:
            out.add(block.text, heading=int(level.group(1)) + 1 if level else None)
    return out.document(title)


def _shape_texts(shapes) -> list[str]:
    """The text of slide shapes in order: text frames, table rows, and the
    shapes inside groups."""
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    texts = []
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            texts.extend(_shape_texts(shape.shapes))
        elif getattr(shape, "has_table", False) and shape.has_table:
            rows = [[cell_text(c.text) for c in row.cells] for row in shape.table.rows]
            texts.append("\n".join(table_rows(rows)))
        elif shape.has_text_frame:
            texts.append(shape.text_frame.text)
    return texts


def load_pptx(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A presentation: one segment per slide, its title as a heading, then
    its other text, tables and speaker notes; TextOverLimit at the first
    block past ``max_chars``."""
    import pptx

    open_zip(source, data, ".pptx").close()
    deck = pptx.Presentation(io.BytesIO(data))
    out = _Builder(max_chars)
    for number, slide in enumerate(deck.slides, start=1):
        out.segment(Location(slide=number))
        title_shape = slide.shapes.title
        slide_title = title_shape.text_frame.text.strip() if title_shape is not None else ""
        out.add(slide_title or f"Slide {number}", heading=1)
        others = [s for s in slide.shapes if title_shape is None or s.shape_id != title_shape.shape_id]
        for text in _shape_texts(others):
            out.add(text)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                out.add("Notes: " + notes.text)
    title = (deck.core_properties.title or "").strip()
    return out.document(title)
