"""Spreadsheets (.xlsx with openpyxl, .csv with the standard library): each
row a line of ``header: value`` pairs, so every chunk repeats the column
headers of its rows; one segment per sheet, each chunk knowing its sheet
and the rows it covers. Each row (the header row too) is one "row" unit
about its sheet's name ("" in a CSV, which has none).

At most ``MAX_ROWS`` rows and ``MAX_COLUMNS`` columns are read from a file;
what is left out is said in the document's warnings. A sheet whose rows make
more chunks than its file may (``chunk_limit``) keeps the rows of its first
chunks, the rest said in a note (:func:`rows_cut_note`), where any other
document over that limit is refused: each row is a whole record, so its
first rows are a usable part of it.

Does not: evaluate formulas (the values Excel saved are read) or read
charts, images or legacy .xls files.
"""

from __future__ import annotations

import csv
import io
from typing import Iterable, Iterator

from ...errors import DocumentError
from .containers import open_zip
from .document import Location, LoadedDocument, Segment, TextOverLimit, Unit, check_text
from .tables import cell_text, header_text, row_text
from .text import decode_text
from .units import stripped

XLSX_SUFFIXES = frozenset({".xlsx", ".xlsm"})
CSV_SUFFIXES = frozenset({".csv", ".tsv"})
MAX_ROWS = 20_000  # per file: about 1 MB of text, some minutes to chunk and embed on a small CPU
MAX_COLUMNS = 256
# A sheet's text repeats its column headers beside every value, so it is
# several times its cells: a 1 MB numeric CSV under ten long headers reads
# as 4.8 MB. The cells (what a bomb inflates) count against the file's text
# limit; the text with its headers may be this many times that limit
# (chosen: room for headers five times their values; its chunks are bounded
# by the chunk limit in any case).
SHEET_TEXT_FACTOR = 4


class _Sheets:
    """Rows gathered sheet by sheet into text, with their row numbers, up to
    the file's row limit."""

    def __init__(self, max_rows: int | None = None, max_chars: int | None = None) -> None:
        self.lines: list[str] = []
        self.length = 0
        self.segments: list[Segment] = []
        self.headings: list[tuple[int, int, str]] = []
        self.max_rows = max_rows if max_rows is not None else MAX_ROWS
        self.max_chars = max_chars  # TextOverLimit as soon as the cells' text passes it
        self.cells = 0  # characters of the cells themselves, each with a separator
        self.rows = 0
        self.warnings: list[str] = []
        self.units: list[Unit] = []

    def add_sheet(self, name: str | None, rows: Iterable[tuple[int, list[str]]]) -> None:
        """Add the sheet ``name`` (None for a CSV) from ``(row number,
        cells)``: the first row with a value is its header."""
        headers: list[str] | None = None
        numbers: list[int] = []
        start = self.length + (1 if self.lines else 0)
        for number, cells in rows:
            if not any(cells):
                continue
            if self.rows >= self.max_rows:
                where = f"sheet {name!r}" if name else "the file"
                self.warnings.append(f"only the first {self.max_rows:,} rows were read ({where} has more); "
                                     "split the file to index the rest")
                break
            if len(cells) > MAX_COLUMNS:
                if not any("columns" in w for w in self.warnings):
                    self.warnings.append(f"only the first {MAX_COLUMNS} columns were read")
                cells = cells[:MAX_COLUMNS]
            line = header_text(cells) if headers is None else row_text(headers, cells)
            headers = headers if headers is not None else cells
            self.cells += sum(len(c) + 1 for c in cells if c)
            self._line(line, name or "")
            numbers.append(number)
            self.rows += 1
        if numbers:
            location = Location(sheet=name)
            self.segments.append(Segment(start, location, numbered="rows", numbers=tuple(numbers)))
            if name:
                self.headings.append((start, 1, name))

    def _line(self, line: str, about: str) -> None:
        if self.lines:
            self.length += 1
        if (span := stripped(line, 0, len(line))) is not None:
            self.units.append(Unit(self.length + span[0], self.length + span[1], "row", about))
        self.lines.append(line)
        self.length += len(line)
        check_text(self.cells, self.max_chars)
        if self.max_chars is not None and self.length > SHEET_TEXT_FACTOR * self.max_chars:
            raise TextOverLimit(self.max_chars)

    def document(self, title: str | None) -> LoadedDocument:
        return LoadedDocument("\n".join(self.lines), tuple(self.segments), title=title, headings=tuple(self.headings),
                              warnings=tuple(self.warnings), units=tuple(self.units))


def _xlsx_rows(sheet) -> Iterator[tuple[int, list[str]]]:
    for number, values in enumerate(sheet.iter_rows(values_only=True), start=1):
        yield number, [cell_text(v) for v in values[: MAX_COLUMNS + 1]]


def load_xlsx(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A workbook's sheets in order, each row with its column headers;
    TextOverLimit as soon as its cells' text passes ``max_chars`` (or the
    text with its headers ``SHEET_TEXT_FACTOR`` times that)."""
    import openpyxl

    open_zip(source, data, suffix, streamed=lambda name: name.startswith("xl/worksheets/")).close()
    # read_only streams the sheet XML instead of building every cell.
    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        out = _Sheets(max_chars=max_chars)
        for sheet in book.worksheets:
            if out.rows >= out.max_rows:
                out.warnings.append(f"sheet {sheet.title!r} and the sheets after it were not read (row limit)")
                break
            if hasattr(sheet, "reset_dimensions"):
                sheet.reset_dimensions()  # a wrong <dimension> would pad every row to it
            out.add_sheet(sheet.title, _xlsx_rows(sheet))
        title = (book.properties.title or "").strip() or None
    finally:
        book.close()
    return out.document(title)


def load_csv(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A CSV (or TSV) file: its first row is the header of every other;
    TextOverLimit as soon as its cells' text passes ``max_chars`` (or the
    text with its headers ``SHEET_TEXT_FACTOR`` times that)."""
    text = decode_text(source, data)
    dialect: type[csv.Dialect] | csv.Dialect = csv.excel_tab if suffix == ".tsv" else csv.excel
    if suffix != ".tsv":
        try:
            dialect = csv.Sniffer().sniff(text[:65536], delimiters=",;\t|")
        except csv.Error:
            pass  # not enough to tell: commas
    try:
        out = _Sheets(max_chars=max_chars)
        reader = csv.reader(io.StringIO(text), dialect)
        out.add_sheet(None, ((n, [cell_text(c) for c in row[: MAX_COLUMNS + 1]]) for n, row in enumerate(reader, 1)))
    except csv.Error as exc:
        raise DocumentError(source, f"malformed CSV ({exc}); check its quoting") from None
    return out.document(None)


def rows_cut_note(document: LoadedDocument, end: int, limit: int) -> str | None:
    """The note for a sheet cut at its chunk ``limit``, the chunks kept
    ending at character ``end`` of its text: the rows kept and the last of
    them, like the ``MAX_ROWS`` note. None when ``document`` is not a sheet
    (all its segments numbered rows): it cannot be cut so, it is refused.

    A 1 MB CSV of a row a chunk: ``"only the first 5,194 rows were indexed
    (to row 5,194): the file makes over 5,194 chunks, ..."``
    """
    if not document.segments or any(s.numbered != "rows" for s in document.segments):
        return None
    kept = document.text.count("\n", 0, end) + 1  # a row a line, as counted against MAX_ROWS
    last = document.locate(max(end - 1, 0), end)
    sheet = f"sheet {last.sheet!r}, " if last.sheet else ""
    where = f"{sheet}row {last.rows[1]:,}" if last.rows else "its end"
    return (f"only the first {kept:,} rows were indexed (to {where}): the file makes over {limit:,} chunks, the most "
            "a file of its size may make; split the file, or raise --max-file-mb (RAG_MAX_FILE_MB), to index the rest")
