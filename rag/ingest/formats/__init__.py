"""Reading documents into text with locations: one registry of file
suffix -> loader, a module per family of formats (``text``, ``html``,
``pdf``, ``office``, ``sheets``, ``epub``, ``code``), and what they return
(``document``).

Every failure is a :class:`~rag.errors.DocumentError` naming the file and
what to do; a library's own error on a damaged file becomes one too.

Does not: split, embed or decide which files to read (see ``rag.ingest``).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Callable

from ...errors import DocumentError
from .code import CODE_SUFFIXES, load_code
from .document import Location, LoadedDocument, Segment
from .epub import EPUB_SUFFIXES, load_epub
from .html import HTML_SUFFIXES, html_to_text, load_html
from .office import DOCX_SUFFIXES, PPTX_SUFFIXES, load_docx, load_pptx
from .pdf import PDF_SUFFIXES, load_pdf
from .sheets import CSV_SUFFIXES, XLSX_SUFFIXES, load_csv, load_xlsx
from .text import TEXT_SUFFIXES, load_text

Loader = Callable[[str, str, bytes], LoadedDocument]

# family -> (suffixes, loader)
FAMILIES: dict[str, tuple[frozenset[str], Loader]] = {
    "text": (TEXT_SUFFIXES, load_text),
    "html": (HTML_SUFFIXES, load_html),
    "pdf": (PDF_SUFFIXES, load_pdf),
    "docx": (DOCX_SUFFIXES, load_docx),
    "pptx": (PPTX_SUFFIXES, load_pptx),
    "xlsx": (XLSX_SUFFIXES, load_xlsx),
    "csv": (CSV_SUFFIXES, load_csv),
    "epub": (EPUB_SUFFIXES, load_epub),
    "code": (CODE_SUFFIXES, load_code),
}
LOADERS: dict[str, Loader] = {suffix: loader for suffixes, loader in FAMILIES.values() for suffix in suffixes}
SUPPORTED_SUFFIXES = frozenset(LOADERS)


def family_of(suffix: str) -> str | None:
    """The family of formats a suffix belongs to (``".xlsx" -> "xlsx"``,
    ``".py" -> "code"``), None if it cannot be read."""
    suffix = suffix.lower()
    return next((name for name, (suffixes, _) in FAMILIES.items() if suffix in suffixes), None)


def is_supported(path: PurePath) -> bool:
    """Whether rag-budget can read files with this path's suffix."""
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def load_document(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """The visible text of a file's ``data``, read as the format its
    ``suffix`` names, with its locations and outline. ``source`` names the
    file in errors.

    Raises DocumentError for binary, non-UTF-8, malformed, encrypted or
    empty input.
    """
    suffix = suffix.lower()
    loader = LOADERS.get(suffix)
    if loader is None:
        raise DocumentError(
            source,
            f"unsupported file type {suffix or '(no suffix)'}; supported: {', '.join(sorted(SUPPORTED_SUFFIXES))}",
        )
    try:
        doc = loader(source, suffix, data)
    except DocumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's error on a damaged file, whatever its type, is one line
        raise DocumentError(source, f"cannot read this {suffix} file ({type(exc).__name__}: {_one_line(exc)}); "
                                    "it may be damaged: re-save or repair it") from None
    if not doc.text.strip():
        raise DocumentError(source, "no text to index (the document is empty)")
    return doc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


__all__ = ["FAMILIES", "LOADERS", "Location", "LoadedDocument", "SUPPORTED_SUFFIXES", "Segment", "family_of",
           "html_to_text", "is_supported", "load_document"]
