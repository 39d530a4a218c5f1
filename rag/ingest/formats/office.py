"""Word (.docx) and PowerPoint (.pptx) documents.

A .docx gives its paragraphs and tables in reading order (python-docx);
paragraphs in a "Heading N" style are the outline, and each table row keeps
its column headers (``tables``). A .pptx gives each slide's text, tables and
speaker notes (python-pptx), one segment per slide, so every chunk knows its
slide; a slide's title heads it in the outline.

Each reader gives the document's own units (:class:`~.document.Unit`): a
heading (a Word "Title"/"Heading N" paragraph, about its parent heading; a
slide's title, about nothing), a list item (a Word paragraph in a List style
or numbered; a slide's paragraph, split into sentences when long), a table
row with its header cells (``Header: cell; ...``, the header row as ``A |
B``), and prose split into sentences (a slide's notes too), each about the
nearest heading above it (on a slide: its title).

Does not: read legacy .doc/.ppt files, images, charts or embedded objects.
"""

from __future__ import annotations

import io
import re

from .containers import open_zip
from .document import Location, LoadedDocument, Segment, Unit, check_text
from .tables import cell_text, header_text, row_text
from .units import prose_units, sentences, stripped

DOCX_SUFFIXES = frozenset({".docx"})
PPTX_SUFFIXES = frozenset({".pptx"})
_HEADING_STYLE = re.compile(r"heading\s*(\d)", re.IGNORECASE)
# A slide's paragraph longer than this that holds several sentences is
# split into them; a shorter one (a bullet) is one item whole.
ITEM_CHARS = 240  # about 40 words (chosen: a bullet of two or three short sentences stays whole)
_NOTES = "Notes: "  # before a slide's speaker notes


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
        self.units: list[Unit] = []
        self._open: list[tuple[int, str]] = []  # (level, heading) of the headings above the next block

    @property
    def about(self) -> str:
        """The nearest heading above the next block ("" for none)."""
        return self.headings[-1][2] if self.headings else ""

    def add(self, block: str, *, heading: int | None = None, kind: str | None = None) -> None:
        """Add a block and its units: a heading (``heading`` its level) is
        one "heading" unit, about its parent heading; ``kind`` "item" makes
        the block one item, "row" each of its lines a row, "slide" each of
        its lines (a slide's paragraphs) an item or, when long, its
        sentences, "notes" each line's sentences; else it is prose
        (:func:`prose_units`). Every other unit is about the nearest heading."""
        block = block.strip()
        if not block:
            return
        if self.parts:
            self.parts.append("\n\n")
            self.length += 2
        at = self.length
        if heading is not None:
            name = " ".join(block.split())
            while self._open and self._open[-1][0] >= heading:
                self._open.pop()
            parent = self._open[-1][1] if self._open else ""  # what a heading is about
            self._open.append((heading, name))
            self.headings.append((at, heading, name))
        self.parts.append(block)
        self.length += len(block)
        check_text(self.length, self.max_chars)
        about = self.about
        if heading is not None:
            found = [Unit(*whole, "heading", parent)] if (whole := stripped(block, 0, len(block))) else []
        elif kind == "item":
            found = [Unit(*whole, "item", about)] if (whole := stripped(block, 0, len(block))) else []
        elif kind in ("row", "slide", "notes"):
            found = _line_units(block, kind, about)
        else:
            found = prose_units(block, [(-1, 1, about)] if about else ())
        self.units.extend(u.shifted(at) for u in found)

    def segment(self, location: Location) -> None:
        """Start a new segment at the next block."""
        start = self.length + (2 if self.parts else 0)
        self.segments.append(Segment(start, location))

    def document(self, title: str | None) -> LoadedDocument:
        return LoadedDocument("".join(self.parts), tuple(self.segments), title=title or None,
                              headings=tuple(self.headings), units=tuple(self.units))


def _line_units(block: str, kind: str, about: str) -> list[Unit]:
    """The units of each line of ``block``: a table's rows ("row"), a
    slide's paragraphs ("slide": an item each, split into sentences when
    longer than ``ITEM_CHARS`` and holding several), a slide's notes
    ("notes": each line's sentences, after the "Notes:" label)."""
    units: list[Unit] = []
    at = len(_NOTES) if kind == "notes" and block.startswith(_NOTES) else 0
    while at <= len(block):
        stop = block.find("\n", at)
        stop = len(block) if stop < 0 else stop
        span = stripped(block, at, stop)
        if span is not None:
            a, b = span
            parts = sentences(block, a, b) if kind == "notes" or (kind == "slide" and b - a > ITEM_CHARS) else [span]
            if kind == "slide" and len(parts) == 1:
                units.append(Unit(a, b, "item", about))
            else:
                unit_kind = "row" if kind == "row" else "text"
                units.extend(Unit(*s, unit_kind, about) for x, y in parts if (s := stripped(block, x, y)))
        at = stop + 1
    return units


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
    styles: dict[str | None, tuple[str, bool]] = {}  # style id -> its name, whether it numbers its paragraphs
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            out.add("\n".join(table_rows(_docx_table(block))), kind="row")
            continue
        key = block._p.style
        if key not in styles:  # python-docx looks a style up among all of them each time
            style_obj = block.style
            styles[key] = ((style_obj.name if style_obj is not None else "") or "", _numbers(style_obj))
        style, numbered = styles[key]
        level = _HEADING_STYLE.match(style)
        if style.lower() == "title":
            title = title or block.text.strip()
            out.add(block.text, heading=1)
        elif level:
            out.add(block.text, heading=int(level.group(1)) + 1)
        else:
            out.add(block.text, kind="item" if _is_list_item(block._p, style, numbered) else None)
    return out.document(title)


def _numbering(element) -> bool | None:
    """Whether a paragraph's or a style's properties number it (a numId
    of 0 takes numbering off), None when they do not say."""
    ppr = element.pPr if element is not None else None
    num = ppr.numPr if ppr is not None else None
    if num is None:
        return None
    return num.numId is None or num.numId.val != 0


def _numbers(style) -> bool:
    """Whether a paragraph style, or a style it is based on, numbers its
    paragraphs."""
    for _ in range(8):  # a chain of styles based on others, bounded
        if style is None:
            return False
        found = _numbering(style.element)
        if found is not None:
            return found
        style = style.base_style
    return False


def _is_list_item(paragraph, style: str, style_numbers: bool) -> bool:
    """Whether a Word paragraph (its ``w:p``) is a list item: in a List
    style ("List Bullet", "List Number 2", "List Paragraph") or numbered,
    by its own numbering or else by its style's."""
    if style.lower().startswith("list"):
        return True
    own = _numbering(paragraph)
    return own if own is not None else style_numbers


def _shape_texts(shapes) -> list[tuple[str, str]]:
    """The text of slide shapes in order, each with what it is ("row" for
    a table's rows, "slide" for a text frame's paragraphs): text frames,
    table rows, and the shapes inside groups."""
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    texts = []
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            texts.extend(_shape_texts(shape.shapes))
        elif getattr(shape, "has_table", False) and shape.has_table:
            rows = [[cell_text(c.text) for c in row.cells] for row in shape.table.rows]
            texts.append(("row", "\n".join(table_rows(rows))))
        elif shape.has_text_frame:
            texts.append(("slide", shape.text_frame.text))
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
        for kind, text in _shape_texts(others):
            out.add(text, kind=kind)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                out.add(_NOTES + notes.text, kind="notes")
    title = (deck.core_properties.title or "").strip()
    return out.document(title)
