"""PDF: each page's text (pypdf), every chunk on one page; pages without a
text layer (scans) read with OCR when it is installed, else reported with
their count and what to install.

A PDF's outline (its bookmarks) gives its headings: each entry is placed
where its title starts a line of its page (after a section number, if any),
else at the start of its page (or after the heading found before it there).
Each page's units are its prose's (:func:`~.units.prose_units`), about the
nearest heading above; a heading found in the text is a "heading" unit,
about its parent entry.

Does not: render pages itself (``ocr`` does) or repair damaged files.
"""

from __future__ import annotations

import io
from typing import Sequence

from ...errors import DocumentError
from .document import LoadedDocument, TextOverLimit, Unit, check_text
from .ocr import ocr_pages, ocr_problem
from .units import prose_units, stripped

PDF_SUFFIXES = frozenset({".pdf"})
_PYPDF_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError)
MAX_OUTLINE_ENTRIES = 5_000  # bookmarks read from a file (chosen: a long manual has a few thousand)
OUTLINE_TITLE_CHARS = 200  # a longer bookmark title is not a heading: it is left out
# Looking for the bookmarks' titles in the pages' text costs at most this
# many times the text's length (chosen: linear whatever the bookmarks);
# past it the rest are placed where their page starts.
OUTLINE_SEARCH_FACTOR = 4
_SECTION_NUMBER = frozenset("0123456789.IVXLivxl ")  # what may stand before a title on its line ("2.1 ", "IV. ")
SECTION_NUMBER_CHARS = 12


def load_pdf(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A PDF's text, a segment per page; pages that are images only are
    read with OCR where it is installed. DocumentError for a malformed or
    encrypted file, or one with no text (saying how many pages are scans
    and what to install); TextOverLimit at the first page that takes the
    text over ``max_chars``."""
    from pypdf.errors import PyPdfError

    if not data.lstrip()[:5] == b"%PDF-":
        raise DocumentError(source, "malformed PDF (no %PDF header); re-export or repair the file")
    try:
        texts, scanned, n_pages, title, outline = _read_pages(source, data, max_chars)
    except (DocumentError, TextOverLimit):
        raise
    except (PyPdfError, *_PYPDF_ERRORS) as exc:
        raise DocumentError(
            source, f"malformed PDF ({type(exc).__name__}: {_one_line(exc)}); re-export or repair the file"
        ) from None
    warnings: list[str] = []
    if scanned:
        problem = ocr_problem()
        if problem is None:
            try:
                read = ocr_pages(data, scanned)
            except (RuntimeError, OSError, ValueError) as exc:  # Tesseract's and PDFium's errors
                raise DocumentError(source, f"OCR failed ({type(exc).__name__}: {_one_line(exc)}); "
                                            "check the Tesseract installation") from None
            texts.update({n: t.strip() for n, t in read.items() if t.strip()})
            warnings.append(f"read with OCR: {len(scanned)} of its {n_pages} pages have no text layer")
        elif any(texts.values()):
            warnings.append(f"{len(scanned)} of {n_pages} pages are scanned images without a text layer "
                            f"({_pages(scanned)}) and were not indexed; {problem}")
        else:
            raise DocumentError(source, f"scanned PDF: {n_pages} page{'s' if n_pages > 1 else ''} of images "
                                        f"without a text layer; {problem}")
    doc = _assemble(texts, title, tuple(warnings), outline)
    check_text(len(doc.text), max_chars)  # with the pages read by OCR
    if not doc.text.strip():
        raise DocumentError(source, f"PDF has no extractable text on any of its {n_pages} pages; "
                                    "re-export it with text, or run OCR on it first")
    return doc


def _read_pages(source: str, data: bytes, max_chars: int | None = None
                ) -> tuple[dict[int, str], list[int], int, str | None, list[tuple[int, int, str]]]:
    """The text of each page, the pages that are images without text, the
    number of pages, the title and the outline (:func:`_outline`);
    TextOverLimit at the first page that takes the text over ``max_chars``."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data), strict=False)
    if reader.is_encrypted and not reader.decrypt(""):
        raise DocumentError(source, "encrypted PDF (password-protected); decrypt it first (e.g. `qpdf --decrypt`)")
    texts: dict[int, str] = {}
    scanned: list[int] = []
    length = 0
    for number, page in enumerate(reader.pages, start=1):
        text = (page.extract_text() or "").strip()
        texts[number] = text
        length += len(text) + 2  # with the break between pages
        check_text(length, max_chars)
        if not text and _has_images(page):
            scanned.append(number)
    metadata = reader.metadata
    title = str(metadata.title).strip() if metadata is not None and metadata.title else None
    return texts, scanned, len(reader.pages), title or None, _outline(reader)


def _outline(reader) -> list[tuple[int, int, str]]:
    """``(page, level, title)`` of the PDF's bookmarks in their order,
    ``page`` 1-based, level 1 at the top; at most ``MAX_OUTLINE_ENTRIES``,
    none when the outline cannot be read (it is not needed to read the
    pages)."""
    from pypdf.errors import PyPdfError

    try:
        items = reader.outline
    except (PyPdfError, *_PYPDF_ERRORS):
        return []
    found: list[tuple[int, int, str]] = []
    stack = [(iter(items), 1)]  # pypdf puts an entry's children, as a list, right after it
    while stack and len(found) < MAX_OUTLINE_ENTRIES:
        entries, level = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
        elif isinstance(entry, list):
            stack.append((iter(entry), level + 1))
        else:
            try:
                page = reader.get_destination_page_number(entry)
                title = " ".join(str(entry.title or "").split())
            except (PyPdfError, *_PYPDF_ERRORS):
                continue
            if isinstance(page, int) and page >= 0 and title and len(title) <= OUTLINE_TITLE_CHARS:
                found.append((page + 1, level, title))
    return found


def _has_images(page) -> bool:
    """Whether the page draws images (a scanned page does)."""
    try:
        xobjects = page.get("/Resources", {}).get_object().get("/XObject")
        if xobjects is None:
            return False
        return any(x.get_object().get("/Subtype") == "/Image" for x in xobjects.get_object().values())
    except _PYPDF_ERRORS:
        return False


def _assemble(texts: dict[int, str], title: str | None, warnings: tuple[str, ...],
              outline: Sequence[tuple[int, int, str]] = ()) -> LoadedDocument:
    parts: list[str] = []
    page_starts: list[tuple[int, int]] = []
    offset = 0
    for number in sorted(texts):
        page_text = texts[number]
        if not page_text:
            continue
        if parts:
            parts.append("\n\n")
            offset += 2
        page_starts.append((number, offset))
        parts.append(page_text)
        offset += len(page_text)
    text = "".join(parts)
    headings, units = _outline_units(text, page_starts, outline)
    return LoadedDocument.paged(text, page_starts, title=title, warnings=warnings, headings=tuple(headings),
                                units=tuple(units))


def _outline_units(text: str, page_starts: Sequence[tuple[int, int]], outline: Sequence[tuple[int, int, str]]
                   ) -> tuple[list[tuple[int, int, str]], list[Unit]]:
    """The headings the ``outline`` places in ``text`` (pages starting at
    ``page_starts``), and the units of each page: its prose's, about the
    nearest heading above, each heading found in the text a heading unit
    about its parent in the outline."""
    by_page: dict[int, list[tuple[int, str]]] = {}
    for page, level, name in outline:
        by_page.setdefault(page, []).append((level, name))
    budget = OUTLINE_SEARCH_FACTOR * len(text)
    headings: list[tuple[int, int, str]] = []
    units: list[Unit] = []
    about = ""
    above: list[tuple[int, str]] = []  # (level, title) of the headings above, outermost first
    ends = [start for _, start in page_starts[1:]] + [len(text)]
    for (page, start), end in zip(page_starts, ends):
        at = start  # where the page's prose not yet split begins
        for level, name in by_page.get(page, ()):
            while above and above[-1][0] >= level:
                above.pop()
            parent = above[-1][1] if above else ""
            above.append((level, name))
            found, budget = _find_title(text, name, start, at, end, budget)
            if found is None:  # not in the text: it heads what follows
                headings.append((at, level, name))
                about = name
                continue
            line, stop = found
            units.extend(prose_units(text, [(-1, 1, about)] if about else (), at, line))
            headings.append((line, level, name))
            about = name
            if (span := stripped(text, line, stop)) is not None:
                units.append(Unit(*span, "heading", parent))
            at = stop
        units.extend(prose_units(text, [(-1, 1, about)] if about else (), at, end))
    return headings, units


def _find_title(text: str, title: str, page: int, start: int, end: int, budget: int
                ) -> tuple[tuple[int, int] | None, int]:
    """Where ``title`` stands at the start of a line of the page
    ``text[page:end]``, after a section number such as "2.1 " at most, at
    or after ``start``, as a whole word: ``(where its line starts, or
    ``start``; where the title ends)``, else None; and what is left of
    the search ``budget`` (characters)."""
    at = start
    while budget > 0:
        budget -= end - at
        found = text.find(title, at, end)
        if found < 0:
            return None, budget
        at = found + 1
        stop = found + len(title)
        if stop < end and text[stop].isalnum():
            continue  # "Intro" in "Introduction"
        low = max(page, found - SECTION_NUMBER_CHARS - 1)
        newline = text.rfind("\n", low, found)
        if newline < 0 and low > page:
            continue  # within a line
        line = max(newline + 1 if newline >= 0 else page, start)
        if all(c in _SECTION_NUMBER for c in text[line:found]):
            return (line, stop), budget
    return None, budget


def _pages(numbers: list[int]) -> str:
    """``[1, 2, 3, 7] -> "pages 1-3, 7"``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    words = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return ("page " if len(numbers) == 1 else "pages ") + ", ".join(words)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
