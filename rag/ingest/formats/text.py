"""Plain text, Markdown and reStructuredText (and AsciiDoc, as Git's
manuals are written in ``.txt`` files): the text as it is, with its section
headings found for the outline and its own units read at ingest
(:mod:`.markup`: sentences, list and definition items, table rows, code
lines, API signatures and headings, each with what it is about).

Headings are the underlined titles of reStructuredText, of Markdown's
setext form and of AsciiDoc, and Markdown's ``#`` headings outside code
fences (see :func:`.markup.find_headings`).

Does not: render markup (the text is indexed as written) or read other formats.
"""

from __future__ import annotations

from ...errors import DocumentError
from .document import LoadedDocument
from .markup import MARKDOWN_SUFFIXES, MAX_HEADING_CHARS, clean_heading, find_headings, read_markup

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst"})


def decode_text(source: str, data: bytes) -> str:
    """``data`` as UTF-8 text (a BOM dropped), line endings as ``\\n``;
    a DocumentError for binary or non-UTF-8 bytes."""
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


def load_text(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """A text, Markdown, reStructuredText or AsciiDoc file, with its outline
    and its units; its title is the first top-level heading."""
    text = decode_text(source, data)
    markup = read_markup(text, suffix)
    top = min((level for _, level, _ in markup.headings), default=None)
    title = next((h for _, level, h in markup.headings if level == top), None)
    return LoadedDocument(text, title=title, headings=markup.headings, units=markup.units)


__all__ = ["MARKDOWN_SUFFIXES", "MAX_HEADING_CHARS", "TEXT_SUFFIXES", "clean_heading", "decode_text",
           "find_headings", "load_text"]
