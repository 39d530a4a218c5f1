"""Plain text, Markdown and reStructuredText: the text as it is, with its
section headings found for the outline.

Headings are the underlined titles of reStructuredText and of Markdown's
setext form (a line of text over a line of one repeated punctuation
character at least as long), and for Markdown the ``#`` headings outside
code fences. Levels follow reStructuredText's rule: each underline style
gets the next level the first time it is seen.

Does not: render markup (the text is indexed as written) or read other formats.
"""

from __future__ import annotations

import re

from ...errors import DocumentError
from .document import LoadedDocument

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})

_UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>:._])\1{2,}[ \t]*")
_ATX_OPEN = re.compile(r"(#{1,6})[ \t]+")  # the rest of the line is cut by hand: see _atx
_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")
_ROLE = re.compile(r":[\w:.+-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")  # :mod:`bisect` -> bisect
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`_{0,2}|\*\*(.+?)\*\*|\*(.+?)\*")
# A heading is cut to this many characters before it is cleaned: the
# patterns above backtrack quadratically over a long enough line, and a
# chunk's context keeps far fewer (MAX_CONTEXT_CHARS).
MAX_HEADING_CHARS = 1000


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


def clean_heading(text: str) -> str:
    """A heading as a reader sees it: roles, literals and emphasis marks
    dropped, `` --- `` as a dash.

    ``clean_heading(":mod:`bisect` --- Array bisection algorithm") -> "bisect — Array bisection algorithm"``
    """
    text = text[:MAX_HEADING_CHARS]
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    text = re.sub(r"\s+-{2,3}\s+", " — ", text)
    return " ".join(text.split())


def find_headings(text: str, *, markdown: bool) -> tuple[tuple[int, int, str], ...]:
    """``(offset, level, heading)`` of the headings of ``text``, in order.

    ``find_headings("Title\\n=====\\n\\nBody", markdown=False) -> ((0, 1, "Title"),)``
    """
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    styles: list[str] = []  # underline styles in order of first use: their index is the level
    found: list[tuple[int, int, str]] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if markdown and _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            heading = _underlined(lines, i, markdown)
            if heading is not None:
                style, title, first = heading
                if markdown:
                    level = 1 if style == "=" else 2
                else:
                    if style not in styles:
                        styles.append(style)
                    level = styles.index(style) + 1
                found.append((starts[first], level, title))
                i += 2  # past the underline
                continue
            atx = _atx(line) if markdown else None
            if atx:
                found.append((starts[i], atx[0], clean_heading(atx[1])))
        i += 1
    return tuple((at, level, title) for at, level, title in found if title)


def _atx(line: str) -> tuple[int, str] | None:
    """``(level, title)`` of a Markdown ``#`` heading line, else None; the
    closing ``#``s and the spaces around the title dropped. In linear time:
    one regex over the whole line (``(.+?)[ \\t]*#*[ \\t]*``) backtracks
    cubically over a run of spaces.

    ``_atx("## Install ##") -> (2, "Install")``
    """
    opening = _ATX_OPEN.match(line)
    rest = line[opening.end():] if opening else ""
    if not rest:
        return None
    # The title is the shortest non-empty start of the rest that leaves only
    # spaces, #s and spaces after it.
    end = len(rest.rstrip(" \t").rstrip("#").rstrip(" \t"))
    return len(opening.group(1)), rest[: max(end, 1)]


def _underlined(lines: list[str], i: int, markdown: bool) -> tuple[str, str, int] | None:
    """``(style, title, first line)`` when line ``i`` is a title over its
    underline (and under a matching overline), else None. Markdown knows
    only ``=`` and ``-`` underlines, and no overlines."""
    if i + 1 >= len(lines):
        return None
    title = lines[i]
    if not title.strip() or title[0].isspace() or _UNDERLINE.fullmatch(title):
        return None
    under = _UNDERLINE.fullmatch(lines[i + 1])
    if not under or len(lines[i + 1].rstrip()) < len(title.rstrip()):
        return None
    if markdown and under.group(1) not in "=-":
        return None
    over = not markdown and i > 0 and lines[i - 1].rstrip() == lines[i + 1].rstrip()
    if not over and i > 0 and lines[i - 1].strip():
        return None  # a title stands after a blank line (or an overline)
    style = ("over" if over else "") + under.group(1)
    return style, clean_heading(title), (i - 1 if over else i)


def load_text(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """A text, Markdown or reStructuredText file, with its outline; its
    title is the first top-level heading."""
    text = decode_text(source, data)
    headings = find_headings(text, markdown=suffix in MARKDOWN_SUFFIXES)
    top = min((level for _, level, _ in headings), default=None)
    title = next((h for _, level, h in headings if level == top), None)
    return LoadedDocument(text, title=title, headings=headings)
