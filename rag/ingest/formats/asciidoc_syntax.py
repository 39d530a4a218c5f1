"""AsciiDoc's line syntax: titles (``== Title``, and the underline levels
of two-line titles), delimited blocks (the closing line repeats the opening
one; see :class:`Delimiters`), preprocessor and attribute lines, block
attributes and titles, and labelled list items (``term::``, ``term;;``).

Does not: read a text's units (``asciidoc_reader``) or its titles (``markup_titles``).
"""

from __future__ import annotations

import bisect
import re

from .markup_syntax import clean_heading

ADOC_TITLE_OPEN = re.compile(r"(={1,6})[ \t]+")  # "== Title": the rest of the line is cut by hand (markup_titles)
# AsciiDoc: delimited blocks (the closing line repeats the opening one), its
# preprocessor and attribute lines, comments, block attributes and titles.
_ADOC_DELIMITER = re.compile(r"(-{4,}|\.{4,}|={4,}|\*{4,}|_{4,}|/{4,}|\+{4,}|--|\|={3,})[ \t]*")
_ADOC_DELIMITER_FIRST = "-.=*_/+|"
ADOC_PREPROCESSOR = re.compile(r"(?:ifn?def|endif|ifeval|include)::[^\[\s]*\[.*\][ \t]*")
ADOC_ATTRIBUTE = re.compile(r":!?[\w-]+!?:(?:[ \t].*)?")  # ":git-diff-core: 1"
ADOC_BLOCK_ATTRIBUTE = re.compile(r"\[[^\[\]]*\]|\[\[[^\]]*\]\]")  # "[verse]", "[source,sh]", "[[anchor]]"
ADOC_BLOCK_TITLE = re.compile(r"\.[\w`'\"*_]")  # ".Example", at the margin
_ADOC_TERM_INLINE = re.compile(r"(?::{2,4}|;;)[ \t]+(?=\S)")  # "'%n':: newline"
ADOC_LEVELS = {"=": 1, "-": 2, "~": 3, "^": 4, "+": 5}  # a two-line title's level, by its underline


class Delimiters:
    """AsciiDoc's delimiter lines, to find the line that closes a block in
    logarithmic time (a block whose closing line never comes is none)."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines
        self._at: dict[str, list[int]] = {}
        for k, line in enumerate(lines):
            if line[:1] in _ADOC_DELIMITER_FIRST and _ADOC_DELIMITER.fullmatch(line):
                self._at.setdefault(line.rstrip(), []).append(k)

    def closing(self, i: int) -> int | None:
        """The line that closes the block line ``i`` opens, None if it opens
        none: a delimiter under a line of text as long, give or take 2, is
        an underline (of a title not found, one after a paragraph's line)."""
        where = self._at.get(self._lines[i].rstrip()) if self._lines[i][:1] in _ADOC_DELIMITER_FIRST else None
        if not where:
            return None
        above = self._lines[i - 1].rstrip() if i > 0 else ""
        if (above and not _ADOC_DELIMITER.fullmatch(above) and not adoc_markup(above)
                and abs(len(above) - len(self._lines[i].rstrip())) <= 2):
            return None
        k = bisect.bisect_right(where, i)
        return where[k] if k < len(where) else None


def adoc_term(line: str) -> tuple[str, str, int | None] | None:
    """``(term, marker, where its inline description starts or None)`` of
    an AsciiDoc labelled list item's line, else None.

    ``adoc_term("--include-untracked::") -> ("--include-untracked", "::", None)``;
    ``adoc_term("'%n':: newline") -> ("'%n'", "::", 6)``
    """
    body = line.rstrip()
    if not body or body.lstrip().startswith(("//", ".. ")):
        return None
    lead = len(line) - len(line.lstrip())
    if body.endswith(";;"):
        term, marker = body[:-2], ";;"
    elif body.endswith("::"):
        term = body.rstrip(":")
        marker = body[len(term):]
        if len(marker) > 4:
            return None
    else:
        inline = _ADOC_TERM_INLINE.search(body, lead)
        if inline is None:
            return None
        term = body[:inline.start()]
        marker = inline.group().strip()
        if not term.strip() or term[-1:].isspace() or ":" in marker[:1] and term.endswith(":"):
            return None
        return _term(term), marker, inline.end()
    if not term.strip() or term[-1:].isspace() or term.endswith((":", ";")):
        return None
    return _term(term), marker, None


def _term(text: str) -> str:
    # "\--" is AsciiDoc's escaped "--" (else a dash).
    return clean_heading(text.replace("\\--", "--"))


def adoc_block(delimiter: str) -> str:
    """What an AsciiDoc block opened by ``delimiter`` holds: "code" (a
    listing or literal block), "quiet" (a comment or passthrough block),
    "table", or "blocks" (an open, example, sidebar or quote block)."""
    mark = delimiter.strip()[:4]
    return {"----": "code", "....": "code", "////": "quiet", "++++": "quiet", "|===": "table"}.get(mark, "blocks")


def adoc_markup(line: str) -> bool:
    """Whether ``line`` is AsciiDoc markup that stands before a block: a
    block attribute or anchor, a list continuation, a block title, a
    comment or a preprocessor line."""
    body = line.strip()
    return bool(body == "+" or ADOC_BLOCK_ATTRIBUTE.fullmatch(body) or ADOC_PREPROCESSOR.fullmatch(body)
                or body.startswith("//") or (line[:1] == "." and ADOC_BLOCK_TITLE.match(line)))
