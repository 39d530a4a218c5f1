"""What a loader returns: a document's text, where each part of it lies in
the original (page, slide, sheet and rows, chapter, line span), and the
title and section headings above each offset.

A :class:`LoadedDocument` is cut into segments (a page, a slide, a sheet, a
chapter, or the whole text); the chunker never lets a chunk span two of
them, so each chunk has one exact location. Inside a segment whose lines are
numbered (a code file's lines, a sheet's rows) a chunk's location names the
first and last line it covers.

Does not: read any file format (the modules beside it do) or split text.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Literal, Sequence

CONTEXT_SEPARATOR = " > "  # between the title and the headings of a chunk's context
MAX_CONTEXT_CHARS = 240  # a chunk's title and headings, as embedded: a few dozen tokens at most

# What one file may cost (issue 37): a 46,711-byte EPUB held 47 MB of text,
# some 276,000 chunks and 48 minutes of embedding on 2 cores. The text read
# from a file is bounded by the file's size: prose deflates 3 to 4 times, so
# a real EPUB, DOCX or PDF holds at most a few characters a byte; a zip bomb
# holds hundreds. At the 95 chunks a second (11,765 chunks in 123 s,
# 2 cores) and about 770 new characters a chunk, a file under 1 MB then
# costs under a minute.
DEFAULT_MAX_FILE_BYTES = 16 << 20  # 16 MiB of text chunks for minutes on a small CPU: see the README
TEXT_PER_FILE_BYTE = 4  # characters of text a file may hold per byte of its own (chosen: prose deflates 3-4x)
MIN_TEXT_CHARS = 2 << 20  # every file may hold this much text, however small (a few thousand chunks)
# Chunks a file may make: its text limit over this. A 200-token chunk of
# prose holds about 770 characters (the README's corpus), so a 1 MB file (4 MB
# of text) may make 5,194 chunks: 55 s at the 95 chunks a second,
# within the goal of a minute (5,700). A file of many tiny pages or chapters,
# whose chunks hold less, is refused at this count rather than run longer.
CHARS_PER_CHUNK = 770


def text_limit(file_bytes: int, ceiling: int = DEFAULT_MAX_FILE_BYTES) -> int:
    """The most characters of text a file of ``file_bytes`` may yield:
    ``TEXT_PER_FILE_BYTE`` a byte, at least ``MIN_TEXT_CHARS``, never over
    ``ceiling`` (the plain-file size limit: no format holds more text than
    a plain file may).

    ``text_limit(46_711) -> 2_097_152``; ``text_limit(10 << 20) -> 16_777_216``
    """
    return min(ceiling, max(MIN_TEXT_CHARS, TEXT_PER_FILE_BYTE * file_bytes))


def chunk_limit(max_chars: int) -> int:
    """The most chunks a file whose text may hold ``max_chars`` may make
    (tiny pages or chapters make many small chunks): a minute of embedding
    for a file under 1 MB.

    ``chunk_limit(text_limit(1_000_000)) -> 5_194``"""
    return max(1, max_chars // CHARS_PER_CHUNK)


class TextOverLimit(Exception):
    """A loader passed its text limit: raised as soon as it does, so the
    rest of the file is never read (``load_document`` names the file)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def check_text(length: int, limit: int | None) -> None:
    """TextOverLimit when ``length`` characters pass ``limit`` (None: no limit)."""
    if limit is not None and length > limit:
        raise TextOverLimit(limit)


@dataclass(frozen=True)
class Location:
    """Where a piece of a document lies in the original file: its ``page``
    (PDF), ``slide`` (presentation), ``sheet`` and ``rows`` (spreadsheet),
    ``chapter`` (EPUB), or ``lines`` (code); unset fields do not apply."""

    page: int | None = None
    slide: int | None = None
    sheet: str | None = None
    rows: tuple[int, int] | None = None
    chapter: int | None = None
    lines: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, object] | None:
        """The fields that apply, as JSON (None when none does).

        ``Location(sheet="Sales", rows=(2, 40)).to_dict() -> {"sheet": "Sales", "rows": [2, 40]}``
        """
        out: dict[str, object] = {}
        for name in ("page", "slide", "sheet", "rows", "chapter", "lines"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out or None

    @classmethod
    def from_dict(cls, raw: object) -> "Location":
        """The location stored by :meth:`to_dict` (an empty one for None or
        anything that is not such a mapping)."""
        if not isinstance(raw, dict):
            return cls()

        def span(value) -> tuple[int, int] | None:
            if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
                return (value[0], value[1])
            return None

        def number(value) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(value) -> str | None:
            return value if isinstance(value, str) else None

        return cls(page=number(raw.get("page")), slide=number(raw.get("slide")), sheet=text(raw.get("sheet")),
                   rows=span(raw.get("rows")), chapter=number(raw.get("chapter")), lines=span(raw.get("lines")))

    def label(self) -> str:
        """The location as a reader says it, empty when there is none.

        ``Location(slide=3).label() -> "slide 3"``;
        ``Location(sheet="Q1", rows=(2, 9)).label() -> "sheet Q1, rows 2-9"``
        """
        parts = []
        if self.page is not None:
            parts.append(f"p.{self.page}")
        if self.slide is not None:
            parts.append(f"slide {self.slide}")
        if self.sheet is not None:
            parts.append(f"sheet {self.sheet}")
        if self.rows is not None:
            parts.append(_span("row", self.rows))
        if self.chapter is not None:
            parts.append(f"chapter {self.chapter}")
        if self.lines is not None:
            parts.append(_span("line", self.lines))
        return ", ".join(parts)


def _span(word: str, span: tuple[int, int]) -> str:
    return f"{word} {span[0]}" if span[0] == span[1] else f"{word}s {span[0]}-{span[1]}"


UNIT_KINDS = ("text", "item", "definition", "row", "code", "signature", "heading")


@dataclass(frozen=True)
class Unit:
    """One of a document's own units, as its reader found it: a sentence of
    prose ("text"), a list item ("item"), a definition's description
    ("definition", its term in ``about``), a table row with its header cells
    in its text ("row"), a code block or line ("code"), an API signature
    ("signature") or a heading. ``text[start:end]`` is the unit, stripped of
    surrounding whitespace; ``about`` says what it is about: a definition's
    term, the signature of the API entry enclosing it, else the nearest
    heading above it ("" if none). A document's units lie in order and do
    not overlap; text outside every unit (markup, blank lines) is none.

    ``Unit(0, 28, "definition", "checkpoint_timeout (integer)")``
    """

    start: int
    end: int
    kind: str = "text"
    about: str = ""

    def to_list(self) -> list:
        """The unit as stored with its chunk: ``[start, end, kind, about]``."""
        return [self.start, self.end, self.kind, self.about]

    @classmethod
    def from_list(cls, raw: object) -> "Unit | None":
        """The unit stored by :meth:`to_list`, None for anything else."""
        if (isinstance(raw, (list, tuple)) and len(raw) == 4 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                     for x in raw[:2])
                and isinstance(raw[2], str) and isinstance(raw[3], str) and 0 <= raw[0] <= raw[1]):
            return cls(raw[0], raw[1], raw[2], raw[3])
        return None

    def shifted(self, by: int) -> "Unit":
        """The same unit with its offsets moved by ``by`` characters."""
        return replace(self, start=self.start + by, end=self.end + by)


def units_within(units: Sequence[Unit], text: str, start: int, end: int) -> tuple[Unit, ...]:
    """The ``units`` of a document whose ``text`` holds them that lie in
    ``text[start:end]`` (a chunk), cut at its bounds and restated from
    ``start``: a unit the chunk holds part of keeps that part (stripped of
    whitespace; dropped when no word is left) and its ``about``.

    With a unit (5, 12): ``units_within(units, text, 8, 20) -> (Unit(0, 4, ...),)``
    """
    starts = [u.start for u in units]
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    out: list[Unit] = []
    for unit in units[i:]:
        if unit.start >= end:
            break
        a, b = max(unit.start, start), min(unit.end, end)
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b and any(c.isalnum() for c in text[a:b]):
            out.append(replace(unit, start=a - start, end=b - start))
    return tuple(out)


@dataclass(frozen=True)
class Segment:
    """A part of a document that chunks do not cross: it starts at
    character ``start`` and lies at ``location``. ``numbered`` says whether
    its lines are numbered as ``"lines"`` or ``"rows"``: line ``i`` (0-based)
    of the segment is number ``numbers[i]``, or ``first + i`` when
    ``numbers`` is empty."""

    start: int
    location: Location = Location()
    numbered: Literal["lines", "rows"] | None = None
    first: int = 1
    numbers: tuple[int, ...] = ()

    def number(self, line: int) -> int:
        """The number of the segment's ``line`` (0-based)."""
        if self.numbers:
            return self.numbers[min(max(line, 0), len(self.numbers) - 1)]
        return self.first + line


@dataclass(frozen=True)
class LoadedDocument:
    """A document's visible text, its segments (in order, the first at 0;
    none for a plain text), its ``title``, and its outline: ``headings``
    holds ``(offset, level, heading)`` in order of offset. ``language`` names
    the programming language of a source file (None for prose). ``warnings``
    say what was left out (rows over the limit, pages without text).
    ``units`` are the document's own units in order (see :class:`Unit`);
    a reader that finds none leaves them to ``load_document``, which
    splits the text into sentences under their headings."""

    text: str
    segments: tuple[Segment, ...] = ()
    title: str | None = None
    headings: tuple[tuple[int, int, str], ...] = ()
    language: str | None = None
    warnings: tuple[str, ...] = ()
    units: tuple[Unit, ...] = ()
    _outline: tuple[list[int], list[tuple[str, ...]]] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def paged(cls, text: str, page_starts: Sequence[tuple[int, int]], **fields) -> "LoadedDocument":
        """A document whose segments are pages: ``page_starts`` holds
        ``(page, offset)`` pairs in order."""
        return cls(text, tuple(Segment(start, Location(page=page)) for page, start in page_starts), **fields)

    @property
    def page_starts(self) -> tuple[tuple[int, int], ...]:
        """``(page, offset)`` of each page segment, in order (empty without pages)."""
        return tuple((s.location.page, s.start) for s in self.segments if s.location.page is not None)

    def page_at(self, offset: int) -> int | None:
        """The 1-based page holding character ``offset``, or None without pages.

        With pages starting at 0 and 120: ``page_at(130) -> 2``.
        """
        segment = self.segment_at(offset)
        return segment.location.page if segment is not None else None

    def segment_at(self, offset: int) -> Segment | None:
        """The segment holding character ``offset`` (None without segments)."""
        if not self.segments:
            return None
        i = max(bisect.bisect_right([s.start for s in self.segments], offset) - 1, 0)
        return self.segments[i]

    def spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` of every segment, in order (one span for the
        whole text without segments)."""
        if not self.segments:
            return [(0, len(self.text))]
        bounds = [s.start for s in self.segments[1:]] + [len(self.text)]
        return [(s.start, end) for s, end in zip(self.segments, bounds)]

    def locate(self, start: int, end: int) -> Location:
        """The location of the text ``[start, end)``, which lies inside one
        segment: the segment's, with the first and last of its numbered
        lines or rows that the text covers."""
        segment = self.segment_at(start)
        if segment is None:
            return Location()
        if segment.numbered is None:
            return segment.location
        last_char = max(end - 1, start)
        first = self.text.count("\n", segment.start, start)
        last = first + self.text.count("\n", start, last_char)
        span = (segment.number(first), segment.number(last))
        return replace(segment.location, **{segment.numbered: span})

    def heading_path(self, offset: int) -> tuple[str, ...]:
        """The headings above character ``offset``, outermost first.

        With headings ``[(0, 1, "A"), (10, 2, "B"), (20, 2, "C")]``:
        ``heading_path(25) -> ("A", "C")``.
        """
        offsets, paths = self._paths()
        i = bisect.bisect_right(offsets, offset) - 1
        return paths[i] if i >= 0 else ()

    def _paths(self) -> tuple[list[int], list[tuple[str, ...]]]:
        if self._outline is None:
            offsets, paths, stack = [], [], []  # stack: (level, heading)
            for at, level, heading in self.headings:
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, heading))
                offsets.append(at)
                paths.append(tuple(h for _, h in stack))
            object.__setattr__(self, "_outline", (offsets, paths))
        return self._outline  # type: ignore[return-value]

    def context(self, offset: int) -> str:
        """The title and the headings above ``offset``, joined with `` > ``,
        each said once, at most ``MAX_CONTEXT_CHARS`` long: what a chunk
        starting there is embedded with (and BM25-indexed with its first part).

        ``"bisect — Array bisection algorithm > Searching Sorted Lists"``
        """
        parts: list[str] = []
        for part in (self.title, *self.heading_path(offset)):
            part = " ".join((part or "").split())
            if part and (not parts or part != parts[-1]) and part not in parts:
                parts.append(part)
        context = CONTEXT_SEPARATOR.join(parts)
        if len(context) > MAX_CONTEXT_CHARS:
            context = context[: MAX_CONTEXT_CHARS - 1].rstrip() + "…"
        return context
