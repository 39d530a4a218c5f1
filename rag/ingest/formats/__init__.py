"""Reading documents into text with locations: one registry of file
suffix -> loader, a module per family of formats (``text``, ``html``,
``pdf``, ``office``, ``sheets``, ``epub``, ``code``, ``man``), and what they
return (``document``). A file's suffix is :func:`format_suffix`'s: a man
page's name ("tcp.7.gz", "ls.1") names it ".man", whatever its last suffix.

Every failure is a :class:`~rag.errors.DocumentError` naming the file and
what to do; a library's own error on a damaged file becomes one too.

Does not: split, embed or decide which files to read (see ``rag.ingest``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePath
from typing import Callable

from ...errors import DocumentError
from .code import CODE_SUFFIXES, load_code
from .document import (MIN_TEXT_CHARS, TEXT_PER_FILE_BYTE, Location, LoadedDocument, Segment, TextOverLimit, Unit,
                       text_limit)
from .epub import EPUB_SUFFIXES, load_epub
from .html import HTML_SUFFIXES, html_to_text, load_html
from .man import MAN_NAME, MAN_SUFFIXES, load_man
from .office import DOCX_SUFFIXES, PPTX_SUFFIXES, load_docx, load_pptx
from .pdf import PDF_SUFFIXES, load_pdf
from .sheets import CSV_SUFFIXES, XLSX_SUFFIXES, load_csv, load_xlsx
from .text import TEXT_SUFFIXES, load_text
from .units import prose_units

Loader = Callable[..., LoadedDocument]  # (source, suffix, data) -> the document

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
    "man": (MAN_SUFFIXES, load_man),
}
LOADERS: dict[str, Loader] = {suffix: loader for suffixes, loader in FAMILIES.values() for suffix in suffixes}
SUPPORTED_SUFFIXES = frozenset(LOADERS)
# Loaders that build their text piece by piece (chapters, rows, paragraphs,
# slides, pages) and stop as soon as it passes the limit, so the rest of a
# zip bomb is never read; each counts what the limit means for its format
# (a sheet: its cells, not the headers repeated beside them). The others
# hold at most their file's bytes of text (plain text, HTML, code) and are
# checked once loaded.
STOPS_EARLY = frozenset({load_epub, load_xlsx, load_csv, load_docx, load_pptx, load_pdf, load_man})
# Said after the list of suffixes wherever it is shown: man pages are found by name, not by one suffix.
MAN_PAGES = "man pages (name.1 to name.8, gzipped or not)"


def format_suffix(name: str) -> str:
    """The suffix that picks a file's loader, from its name (or path, or a
    suffix alone): ".man" for a man page (a name ending in a section 1-8,
    maybe with letters after it, maybe gzipped), else the name's last suffix
    in lower case ("" for none).

    ``format_suffix("tcp.7.gz") -> ".man"``; ``format_suffix("config.5ssl.gz") -> ".man"``;
    ``format_suffix("notes.1") -> ".man"``; ``format_suffix("Guide.PDF") -> ".pdf"``;
    ``format_suffix("a.tar.gz") -> ".gz"``; ``format_suffix(".md") -> ".md"``
    """
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    if MAN_NAME.search(base):
        return ".man"
    dot = base.rfind(".")
    return base[dot:].lower() if 0 <= dot < len(base) - 1 else ""


def family_of(suffix: str) -> str | None:
    """The family of formats a suffix (or a file name) belongs to
    (``".xlsx" -> "xlsx"``, ``".py" -> "code"``, ``"tcp.7.gz" -> "man"``),
    None if it cannot be read."""
    suffix = format_suffix(suffix)
    return next((name for name, (suffixes, _) in FAMILIES.items() if suffix in suffixes), None)


def is_supported(path: PurePath) -> bool:
    """Whether rag-budget can read files of this path's type (its :func:`format_suffix`)."""
    return format_suffix(path.name) in SUPPORTED_SUFFIXES


def load_document(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """The visible text of a file's ``data``, read as the format its
    ``suffix`` names (a :func:`format_suffix`; a file name or a man page's
    suffix such as ".7" works too), with its locations and outline.
    ``source`` names the file in errors.

    Raises DocumentError for binary, non-UTF-8, malformed, encrypted or
    empty input, and for text over ``max_chars`` characters (default:
    :func:`~rag.ingest.formats.document.text_limit` of the file's size),
    a loader that builds its text piece by piece stopping as soon as it
    passes it.
    """
    limit = text_limit(len(data)) if max_chars is None else max_chars
    suffix = format_suffix(suffix)
    loader = LOADERS.get(suffix)
    if loader is None:
        raise DocumentError(
            source,
            f"unsupported file type {suffix or '(no suffix)'}; supported: {', '.join(sorted(SUPPORTED_SUFFIXES))}, "
            f"and {MAN_PAGES}",
        )
    try:
        if loader in STOPS_EARLY:
            doc = loader(source, suffix, data, max_chars=limit)
        else:
            doc = loader(source, suffix, data)
            if len(doc.text) > limit:
                raise TextOverLimit(limit)
    except TextOverLimit as exc:
        raise DocumentError(source, over_limit(exc.limit, len(data))) from None
    except DocumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's error on a damaged file, whatever its type, is one line
        raise DocumentError(source, f"cannot read this {suffix} file ({type(exc).__name__}: {_one_line(exc)}); "
                                    "it may be damaged: re-save or repair it") from None
    if not doc.text.strip():
        raise DocumentError(source, "no text to index (the document is empty)")
    if not doc.units:
        doc = replace(doc, units=tuple(prose_units(doc.text, doc.headings)))
    return doc


def over_limit(limit: int, file_bytes: int) -> str:
    """Why a file's text was refused, in one line, naming the limit."""
    return (f"its text passes {limit:,} characters, the most a {file_bytes:,}-byte file may hold ({TEXT_PER_FILE_BYTE} a byte, "
            f"at least {MIN_TEXT_CHARS >> 20} MiB, at most the file-size limit); not indexed (a zip bomb?): split the file, or raise "
            "--max-file-mb (RAG_MAX_FILE_MB) for a large one")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


__all__ = ["FAMILIES", "LOADERS", "Location", "LoadedDocument", "MAN_PAGES", "SUPPORTED_SUFFIXES", "Segment", "Unit",
           "family_of", "format_suffix", "html_to_text", "is_supported", "load_document"]
