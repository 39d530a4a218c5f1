"""PDF: each page's text (pypdf), every chunk on one page; pages without a
text layer (scans) read with OCR when it is installed, else reported with
their count and what to install.

Does not: render pages itself (``ocr`` does) or repair damaged files.
"""

from __future__ import annotations

import io

from ...errors import DocumentError
from .document import LoadedDocument, TextOverLimit, check_text
from .ocr import ocr_pages, ocr_problem

PDF_SUFFIXES = frozenset({".pdf"})
_PYPDF_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError)


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
        texts, scanned, n_pages, title = _read_pages(source, data, max_chars)
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
    doc = _assemble(texts, title, tuple(warnings))
    check_text(len(doc.text), max_chars)  # with the pages read by OCR
    if not doc.text.strip():
        raise DocumentError(source, f"PDF has no extractable text on any of its {n_pages} pages; "
                                    "re-export it with text, or run OCR on it first")
    return doc


def _read_pages(source: str, data: bytes, max_chars: int | None = None
                ) -> tuple[dict[int, str], list[int], int, str | None]:
    """The text of each page, the pages that are images without text, the
    number of pages and the title; TextOverLimit at the first page that
    takes the text over ``max_chars``."""
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
    return texts, scanned, len(reader.pages), title or None


def _has_images(page) -> bool:
    """Whether the page draws images (a scanned page does)."""
    try:
        xobjects = page.get("/Resources", {}).get_object().get("/XObject")
        if xobjects is None:
            return False
        return any(x.get_object().get("/Subtype") == "/Image" for x in xobjects.get_object().values())
    except _PYPDF_ERRORS:
        return False


def _assemble(texts: dict[int, str], title: str | None, warnings: tuple[str, ...]) -> LoadedDocument:
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
    return LoadedDocument.paged("".join(parts), page_starts, title=title, warnings=warnings)


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
