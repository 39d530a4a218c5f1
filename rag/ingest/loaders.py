"""Reading documents into plain text.

Turns the bytes of a .txt, .md, .rst, .html/.htm or .pdf file into the text a
reader sees, with the character offset where each PDF page starts so chunks
can carry page numbers.

Does not: split, embed or decide which files to read (see ``rag.ingest``).
Every failure is a :class:`~rag.errors.DocumentError` naming the problem.
"""

from __future__ import annotations

import bisect
import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

from ..errors import DocumentError

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
PDF_SUFFIXES = frozenset({".pdf"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


@dataclass(frozen=True)
class LoadedDocument:
    """A document's visible text. ``page_starts`` holds ``(page, offset)``
    pairs in order, empty for formats without pages."""

    text: str
    page_starts: tuple[tuple[int, int], ...] = ()

    def page_at(self, offset: int) -> int | None:
        """The 1-based page holding character ``offset``, or None without pages.

        With pages starting at 0 and 120: ``page_at(130) -> 2``.
        """
        if not self.page_starts:
            return None
        offsets = [start for _, start in self.page_starts]
        i = max(bisect.bisect_right(offsets, offset) - 1, 0)
        return self.page_starts[i][0]


def is_supported(path: PurePath) -> bool:
    """Whether rag-budget can read files with this path's suffix."""
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def load_document(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """The visible text of a file's ``data``, read as the format its
    ``suffix`` names. ``source`` names the file in errors.

    Raises DocumentError for binary, non-UTF-8, malformed or empty input.
    """
    suffix = suffix.lower()
    if suffix in PDF_SUFFIXES:
        doc = _load_pdf(source, data)
    elif suffix in HTML_SUFFIXES:
        doc = LoadedDocument(html_to_text(_decode_text(source, data)))
    elif suffix in TEXT_SUFFIXES:
        doc = LoadedDocument(_decode_text(source, data))
    else:
        raise DocumentError(
            source,
            f"unsupported file type {suffix or '(no suffix)'}; "
            f"supported: {', '.join(sorted(SUPPORTED_SUFFIXES))}",
        )
    if not doc.text.strip():
        raise DocumentError(source, "no text to index (the document is empty)")
    return doc


def _decode_text(source: str, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise DocumentError(source, "binary file, not text; remove it or exclude it with --exclude")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            source,
            f"not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "convert it, e.g. `iconv -f latin1 -t utf-8`",
        ) from None
    # Normalise line endings so character spans do not depend on the platform
    # that wrote the file.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _load_pdf(source: str, data: bytes) -> LoadedDocument:
    # pypdf is imported here, not at module import, so that reading text
    # files never pays for it.
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.lstrip()[:5] == b"%PDF-":
        raise DocumentError(source, "malformed PDF (no %PDF header); re-export or repair the file")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(source, "encrypted PDF; decrypt it first (e.g. `qpdf --decrypt`)")
        parts: list[str] = []
        page_starts: list[tuple[int, int]] = []
        offset = 0
        for number, page in enumerate(reader.pages, start=1):
            page_text = (page.extract_text() or "").strip()
            if not page_text:
                continue
            if parts:
                parts.append("\n\n")
                offset += 2
            page_starts.append((number, offset))
            parts.append(page_text)
            offset += len(page_text)
    except DocumentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as exc:
        raise DocumentError(
            source, f"malformed PDF ({type(exc).__name__}: {_one_line(exc)}); re-export or repair the file"
        ) from None
    text = "".join(parts)
    if not text.strip():
        raise DocumentError(source, "PDF has no extractable text (scanned images?); run OCR on it first")
    return LoadedDocument(text, tuple(page_starts))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


class _VisibleText(HTMLParser):
    """Collects text a browser would show: no scripts, styles or markup."""

    _HIDDEN = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe", "object"})
    _BLOCK = frozenset(
        {
            "p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "section",
            "article", "header", "footer", "nav", "aside", "main", "blockquote", "pre",
            "h1", "h2", "h3", "h4", "h5", "h6", "hr", "title", "figure", "figcaption",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self._HIDDEN:
            self._hidden_depth += 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self._HIDDEN and self._hidden_depth:
            self._hidden_depth -= 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        # The title sits inside <head> but is shown to the reader.
        if self._hidden_depth == 0 or self._in_title:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of an HTML page, one block per paragraph.

    ``"<p>a <b>b</b></p><script>x()</script>" -> "a b"``
    """
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
