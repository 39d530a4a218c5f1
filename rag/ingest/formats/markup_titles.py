"""The titles of a markup text, which make its outline: reStructuredText's
and Markdown's setext underlined (and overlined) titles, Markdown's ``#``
headings outside code fences, AsciiDoc's two-line titles and ``== Title``
lines (none inside a listing or literal block).

Does not: read the text's units (``markup_reader``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .asciidoc_syntax import ADOC_LEVELS, ADOC_PREPROCESSOR, ADOC_TITLE_OPEN, Delimiters, adoc_block, adoc_markup
from .markup_syntax import FENCE, UNDERLINE, clean_heading

_ATX_OPEN = re.compile(r"(#{1,6})[ \t]+")  # the rest of the line is cut by hand: see _atx


@dataclass(frozen=True)
class Title:
    """A title found over the lines ``first`` to ``last``, its text on ``line``."""

    first: int  # its first line (an overline, or the title)
    line: int  # the title's line
    last: int  # its last line (the underline, or the title)
    level: int
    title: str


def find_titles(lines: list[str], dialect: str) -> list[Title]:
    """The titles of a text's ``lines`` written in ``dialect``, in order.
    Levels follow reStructuredText's rule: each underline style gets the
    next level the first time it is seen (Markdown's ``=`` is 1 and ``-`` 2;
    AsciiDoc's are fixed, see ``ADOC_LEVELS``)."""
    markdown, asciidoc = dialect == "markdown", dialect == "asciidoc"
    styles: list[str] = []  # underline styles in order of first use: their index is the level
    found: list[Title] = []
    delimiters = Delimiters(lines) if asciidoc else None
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if markdown and FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            heading = _underlined(lines, i, dialect)
            if heading is not None:
                style, title, first = heading
                if markdown:
                    level = 1 if style == "=" else 2
                elif asciidoc:
                    level = ADOC_LEVELS[style]
                else:
                    if style not in styles:
                        styles.append(style)
                    level = styles.index(style) + 1
                if title:
                    found.append(Title(first, i, i + 1, level, title))
                i += 2  # past the underline
                continue
            close = delimiters.closing(i) if delimiters is not None else None
            if close is not None and adoc_block(line) in ("code", "quiet"):
                i = close + 1  # a listing, literal, comment or passthrough block holds no titles
                continue
            one_line = _atx(line, _ATX_OPEN) if markdown else _atx(line, ADOC_TITLE_OPEN) if asciidoc else None
            if one_line and (title := clean_heading(one_line[1])):
                found.append(Title(i, i, i, one_line[0], title))
        i += 1
    return found


def _atx(line: str, opening_pattern: re.Pattern) -> tuple[int, str] | None:
    """``(level, title)`` of a Markdown ``#`` heading line (or AsciiDoc's
    ``==``), else None; the closing marks and the spaces around the title
    dropped. In linear time: one regex over the whole line
    (``(.+?)[ \\t]*#*[ \\t]*``) backtracks cubically over a run of spaces.

    ``_atx("## Install ##", _ATX_OPEN) -> (2, "Install")``
    """
    opening = opening_pattern.match(line)
    rest = line[opening.end():] if opening else ""
    if not rest:
        return None
    mark = opening.group(1)[0]
    # The title is the shortest non-empty start of the rest that leaves only
    # spaces, marks and spaces after it.
    end = len(rest.rstrip(" \t").rstrip(mark).rstrip(" \t"))
    return len(opening.group(1)), rest[: max(end, 1)]


def _underlined(lines: list[str], i: int, dialect: str) -> tuple[str, str, int] | None:
    """``(style, title, first line)`` when line ``i`` is a title over its
    underline (and under a matching overline), else None. Markdown knows
    only ``=`` and ``-`` underlines, and no overlines; AsciiDoc no
    overlines, and its underline is as long as its title, give or take 2."""
    if i + 1 >= len(lines):
        return None
    title = lines[i]
    if not title.strip() or title[0].isspace() or UNDERLINE.fullmatch(title):
        return None
    under = UNDERLINE.fullmatch(lines[i + 1])
    if not under or len(lines[i + 1].rstrip()) < len(title.rstrip()):
        return None
    if dialect == "markdown" and under.group(1) not in "=-":
        return None
    if dialect == "asciidoc" and (under.group(1) not in ADOC_LEVELS
                                  or len(lines[i + 1].rstrip()) > len(title.rstrip()) + 2
                                  or title[0] in "[.+/" or ADOC_PREPROCESSOR.fullmatch(title)):
        return None
    over = dialect not in ("markdown", "asciidoc") and i > 0 and lines[i - 1].rstrip() == lines[i + 1].rstrip()
    if not over and i > 0 and lines[i - 1].strip() and not (dialect == "asciidoc" and adoc_markup(lines[i - 1])):
        return None  # a title stands after a blank line (or an overline; in AsciiDoc, an anchor)
    style = ("over" if over else "") + under.group(1)
    return style, clean_heading(title), (i - 1 if over else i)
