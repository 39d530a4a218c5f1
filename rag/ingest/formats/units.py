"""A document's own units where its reader found no finer structure: each
paragraph split into sentences (a list item, a short line and a heading
kept whole), each about the nearest heading above it.

The readers that know their format's structure (HTML's definition lists
and tables, reStructuredText's directives, a man page's tagged paragraphs)
build their units themselves and call :func:`sentences` for their prose.

Does not: read any format's markup.
"""

from __future__ import annotations

import bisect
import re
from typing import Sequence

from .document import Unit

_SENTENCE_END = re.compile(r"[.!?][\"')\]*]*(?=\s)")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf", "al", "approx", "mr", "mrs", "dr", "fig", "resp"})
_ITEM = re.compile(r"[ \t]*(?:[-*+\u2022]|\d{1,3}[.)]|#\.)[ \t]+\S")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def sentences(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of the sentences of ``text[start:end]``, split after
    [.!?] (and closing quotes or brackets) before whitespace, not after
    "e.g", "i.e", "etc", "vs" or an initial, never at ':' or ';'; spans are
    not stripped.

    ``sentences("See os.path.join. It joins, e.g. paths.") -> [(0, 17), (17, 39)]``
    """
    end = len(text) if end is None else end
    spans, at = [], start
    for m in _SENTENCE_END.finditer(text, start, end):
        # The word before the mark, looked for in the few characters before it: a long run of
        # abbreviations ("e.g. e.g. ...") would otherwise be read again at each of them.
        words = text[max(at, m.start() - 64):m.start()].rsplit(None, 1) if m.group()[0] == "." else []
        word = words[-1].lstrip("(\"'*`") if words else ""
        if word.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]", word):
            continue  # "e.g. a", "J. Smith"
        spans.append((at, m.end()))
        at = m.end()
    if at < end:
        spans.append((at, end))
    return spans


def stripped(text: str, start: int, end: int) -> tuple[int, int] | None:
    """``(start, end)`` of ``text[start:end]`` without surrounding
    whitespace, None when it holds no word character."""
    piece = text[start:end]
    if not re.search(r"\w", piece):
        return None
    return start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())


class Headings:
    """The nearest heading above an offset, from a document's outline
    (``(offset, level, heading)`` in order of offset)."""

    def __init__(self, headings: Sequence[tuple[int, int, str]]) -> None:
        self._offsets = [at for at, _, _ in headings]
        self._levels = [level for _, level, _ in headings]
        self._names = [name for _, _, name in headings]

    def above(self, offset: int) -> str:
        """The heading that starts at or before ``offset`` nearest to it ("" for none)."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._names[i] if i >= 0 else ""

    def parent(self, offset: int) -> str:
        """The heading a heading starting at ``offset`` sits under: the
        nearest one above it of a higher level ("" for none)."""
        i = bisect.bisect_left(self._offsets, offset)
        level = self._levels[i] if i < len(self._offsets) and self._offsets[i] == offset else 99
        for k in range(i - 1, -1, -1):
            if self._levels[k] < level:
                return self._names[k]
        return ""

    def starts_at(self, offset: int) -> bool:
        """Whether a heading starts at ``offset``."""
        i = bisect.bisect_left(self._offsets, offset)
        return i < len(self._offsets) and self._offsets[i] == offset


def prose_units(text: str, headings: Sequence[tuple[int, int, str]] = (), start: int = 0,
                end: int | None = None) -> list[Unit]:
    """The units of plain prose ``text[start:end]``: each paragraph (text
    between blank lines) split into sentences, about the nearest heading
    above it; a paragraph a heading starts, a list item ("- x", "2) y"),
    and each line of a paragraph of short lines (an address, a menu) are
    units whole.

    ``prose_units("Intro\\n\\nOne. Two.", [(0, 1, "Intro")])`` -> a heading
    unit "Intro" (about the heading above it, here none), then "One." and
    "Two." about "Intro".
    """
    end = len(text) if end is None else end
    outline = Headings(headings)
    units: list[Unit] = []
    at = start
    for brk in [*_PARAGRAPH_BREAK.finditer(text, start, end), None]:
        stop = brk.start() if brk else end
        span = stripped(text, at, stop)
        at = brk.end() if brk else end
        if span is None:
            continue
        a, b = span
        about = outline.above(a)
        if outline.starts_at(a) and "\n" not in text[a:b]:
            units.append(Unit(a, b, "heading", outline.parent(a)))
            continue
        lines = _lines(text, a, b)
        if len(lines) > 1 and any(_ITEM.match(text, x) for x, _ in lines):
            # A list: each item runs on over the lines indented under it.
            for x, y in _items(text, lines):
                units.append(Unit(x, y, "item", about))
        elif len(lines) > 1 and all(y - x < 40 for x, y in lines):
            units.extend(Unit(x, y, "text", about) for x, y in lines if stripped(text, x, y))
        else:
            kind = "item" if _ITEM.match(text, a) else "text"
            for x, y in sentences(text, a, b) if kind == "text" else [(a, b)]:
                if (s := stripped(text, x, y)) is not None:
                    units.append(Unit(*s, kind, about))
    return units


def _lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    spans, at = [], start
    while at <= end:
        stop = text.find("\n", at, end)
        stop = end if stop < 0 else stop
        if text[at:stop].strip():
            spans.append((at, stop))
        at = stop + 1
    return spans


def _items(text: str, lines: list[tuple[int, int]]) -> list[tuple[int, int]]:
    items: list[list[int]] = []
    for x, y in lines:
        if _ITEM.match(text, x) or not items:
            items.append([x, y])
        else:
            items[-1][1] = y
    return [s for x, y in items if (s := stripped(text, x, y))]
