"""The text of a man page as it is written: paragraphs (filled, or kept
line by line in no-fill mode), headings, definitions and list items by
``.RS`` depth, tables' rows, and the units of each; then the whole as a
:class:`~.document.LoadedDocument`. The macros of ``man`` and ``mdoc`` say
what to write; this says how it is written and what each unit is about.

Each paragraph of a definition's description is one "definition" unit
about its terms (after the enclosing item's, when it is nested); a list
item's paragraphs are "item" units; other paragraphs are split into
sentences ("text", about the nearest heading); no-fill lines are "code",
a table's rows "row". A term with no description is a "definition" unit
about itself.

Does not: read roff (see ``roff``) or lay the text out (no line filling,
hyphenation or indentation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .document import CONTEXT_SEPARATOR, LoadedDocument, Unit, check_text
from .roff import squash
from .units import sentences, stripped

# The first section's heading when it is surely the NAME line's (else its line must be short to be taken).
_NAME_HEADINGS = frozenset({"NAME", "NOM", "NOMBRE", "NAAM", "NOME", "BEZEICHNUNG", "NAZWA", "ИМЯ", "NAVN", "NIMI"})


@dataclass
class Item:
    """A definition (its terms) or a list item (its marker) that the
    paragraphs after it belong to, at one ``.RS`` depth."""

    kind: str  # "definition" or "item"
    outer: str  # what the enclosing item or heading is about
    nested: bool = False  # inside another item: a term is said after what that one is about
    marker: str = ""
    terms: list[str] = field(default_factory=list)
    term_spans: list[tuple[int, int]] = field(default_factory=list)
    described: bool = False

    @property
    def about(self) -> str:
        """The terms ("a, b" for .TQ's), after the enclosing item's ("tcp_frto > 2"), else the enclosing's."""
        if not self.terms:
            return self.outer
        terms = ", ".join(self.terms)
        return f"{self.outer}{CONTEXT_SEPARATOR}{terms}" if self.nested and self.outer else terms


class PageText:
    """The text written so far, its units and outline, and what is being
    read into it: the paragraph, a heading or term whose text is on the
    lines after its macro, and the open items (``frames``: one per ``.RS``
    depth, None where no item is open). TextOverLimit as soon as the text
    passes ``max_chars``."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.length = 0
        self.units: list[Unit] = []
        self.headings: list[tuple[int, int, str]] = []
        self.heading = ""
        self.title: str | None = None
        self.name_line: str | None = None
        self.frames: list[Item | None] = [None]
        self.para: list[list[str]] = []  # the paragraph's lines, each as its pieces (joined once, when written)
        self.para_nf = False
        self.para_len = 0
        self.nf = False  # no-fill mode (.nf, .EX): lines kept as they are
        self.nospace = False  # the last line ended in \c: the next goes on without a space
        self.capture: tuple[str, object] | None = None  # ("heading", level) or ("term", Item)
        self.captured: list[str] = []
        self.after_term: Item | None = None

    # -- the page as read --------------------------------------------------------------

    def document(self) -> LoadedDocument:
        """The page written so far, its title with the NAME line's description
        ("tcp(7) — TCP protocol"), headings and units in order."""
        title = self.title
        if title and self.name_line:
            m = re.search(r"\s[-–—]+\s+(.+)", self.name_line)
            if m:
                title = f"{title} — {m.group(1).strip()}"
        self.units.sort(key=lambda u: u.start)
        return LoadedDocument("".join(self.parts), title=title, headings=tuple(self.headings), units=tuple(self.units))

    # -- writing -------------------------------------------------------------------------

    def _write(self, s: str) -> None:
        """``s`` added to the text, checked against the limit."""
        self.parts.append(s)
        self.length += len(s)
        check_text(self.length, self.max_chars)

    def _block(self, lines: list[str], tight: bool = False) -> list[tuple[int, int]]:
        """Write ``lines`` as a block (after a blank line, or a line break
        when ``tight``); the span of each line."""
        if self.length:
            self._write("\n" if tight or self.after_term is not None else "\n\n")
        spans = []
        for k, line in enumerate(lines):
            if k:
                self._write("\n")
            start = self.length
            self._write(line)
            spans.append((start, self.length))
        self.after_term = None
        return spans

    def paragraph(self, lines: list[str], kind: str, about: str, skip: int = 0) -> None:
        """Write a paragraph's ``lines`` with its units: a "text" paragraph's
        sentences, else the whole paragraph one unit (less its first ``skip``
        characters, a list marker)."""
        self._described()
        spans = self._block(lines)
        if kind == "text":
            for (a, _), line in zip(spans, lines):
                for x, y in sentences(line):
                    self.unit(a + x, line[x:y], kind, about)
        else:
            self.unit(spans[0][0] + skip, "\n".join(lines)[skip:], kind, about)

    def unit(self, at: int, text: str, kind: str, about: str) -> None:
        """A unit of ``text``, written at ``at`` (stripped; none without a word)."""
        span = stripped(text, 0, len(text))
        if span is not None and any(c.isalnum() for c in text[span[0]:span[1]]):
            self.units.append(Unit(at + span[0], at + span[1], kind, about))

    def rows(self, lines: list[str]) -> None:
        """Write a table's rows, a line each, each a "row" unit about what encloses the table."""
        item = self.current_item()
        about = item.about if item is not None else self.heading
        self._described()
        for (a, _), line in zip(self._block(lines), lines):
            self.unit(a, line, "row", about)

    # -- the paragraph -----------------------------------------------------------------

    def add(self, text: str, more: bool = False) -> None:
        """A line's text: into the heading or term being read, else the paragraph."""
        if self.capture is not None:
            self.captured.append(text if self.nospace or not self.captured else " " + text)
            self.para_len += len(text) + 1
            check_text(self.length + self.para_len, self.max_chars)
            self.nospace = more
            if not more:
                self.end_capture()
            return
        if self.para and self.para_nf != self.nf:
            self.flush()
        self.para_len += len(text) + 1
        check_text(self.length + self.para_len, self.max_chars)
        if not self.para:
            self.para, self.para_nf = [[text]], self.nf
        elif self.nf:
            if self.nospace:
                self.para[-1].append(text)
            else:
                self.para.append([text])
        elif self.nospace or not self.para[-1]:
            self.para[-1].append(text)
        else:
            self.para[-1].append(" " + text)
        self.nospace = more

    def line_break(self) -> None:
        """A line break (``.br``, a line that starts with a space): the paragraph goes on on a new line."""
        if self.para and not self.para_nf and self.para[-1]:
            self.para.append([])
        self.nospace = False

    def blank(self) -> None:
        """A blank line (``.sp``): a paragraph ends (in no-fill mode, an empty line is kept)."""
        if self.capture is not None:
            return
        if self.nf:
            if self.para and self.para_nf:
                self.para.append([])
        else:
            self.flush()
        self.nospace = False

    def flush(self) -> None:
        """Write the paragraph being read, with its units."""
        if not self.para:
            return
        lines, nf = ["".join(pieces) for pieces in self.para], self.para_nf
        self.para, self.para_len, self.nospace = [], 0, False
        item = self.current_item()
        about = item.about if item is not None else self.heading
        if nf:
            lines = [line.rstrip() for line in lines]
            while lines and not lines[-1].strip():
                lines.pop()
            while lines and not lines[0].strip():
                lines.pop(0)
            if lines:
                self._described()
                for (a, _), line in zip(self._block(lines), lines):
                    self.unit(a, line, "code", about)
            return
        lines = [line for line in map(squash, lines) if line]
        if not lines:
            return
        kind = item.kind if item is not None else "text"
        if item is not None and item.marker:
            lines[0] = f"{item.marker} {lines[0]}"
        self.paragraph(lines, kind, about, len(item.marker) + 1 if item is not None and item.marker else 0)
        if item is not None:
            item.marker = ""
        if self.name_line is None and len(self.headings) == 1 and kind == "text":
            line = " ".join(lines)  # the NAME line: "tcp - TCP protocol"
            if self.headings[0][2].upper() in _NAME_HEADINGS or len(line) < 300:
                self.name_line = line

    def set_no_fill(self, on: bool) -> None:
        """No-fill mode on (``.nf``, ``.EX``) or off (``.fi``, ``.EE``): the paragraph ends."""
        self.flush()
        self.nf = on

    def settle(self) -> None:
        """What is being read ends: a heading or term on the lines after its macro, and the paragraph."""
        self.end_capture()
        self.flush()

    # -- headings and terms read from the next line ------------------------------------

    def section(self, level: int, text: str) -> None:
        """A section heading (``.SH`` level 1, ``.SS`` 2): every item ends and
        fill mode is back; with no ``text`` the heading is the next line's."""
        self.end_capture()
        self.reset()
        self.nf = False
        if text:
            self._heading(level, text)
        else:
            self.capture, self.captured = ("heading", level), []

    def capture_term(self, item: Item) -> None:
        """The next line's text is a term of ``item`` (``.TP``, ``.TQ``)."""
        self.capture, self.captured = ("term", item), []

    def end_capture(self) -> None:
        """The heading or term being read from the lines after its macro is
        complete: it is written."""
        if self.capture is None:
            return
        (kind, target), text = self.capture, squash("".join(self.captured))
        self.capture, self.captured, self.nospace, self.para_len = None, [], False, 0
        if kind == "heading":
            self._heading(target, text)  # type: ignore[arg-type]
        else:
            self.term(target, text)  # type: ignore[arg-type]

    def _heading(self, level: int, text: str) -> None:
        """Write a heading (none when empty): every item ends, and what follows is about it."""
        if not text:
            return
        self.reset()
        (a, _), = self._block([text])
        self.headings.append((a, level, text))
        self.heading = text
        self.unit(a, text, "heading", text)

    def term(self, item: Item, text: str) -> None:
        """Write a term of ``item`` (none when empty), on the line under the term before it if any."""
        if not text:
            return
        self.flush()
        tight = self.after_term is item
        (a, b), = self._block([text], tight=tight)
        item.terms.append(text)
        item.term_spans.append((a, b))
        self.after_term = item

    # -- items, by .RS depth -----------------------------------------------------------

    def current_item(self) -> Item | None:
        """The innermost open item, at this ``.RS`` depth or an outer one; None if none is open."""
        return next((item for item in reversed(self.frames) if item is not None), None)

    def new_item(self, kind: str, marker: str = "") -> Item:
        """An item at this depth, in the enclosing item (else under the heading)."""
        outer = next((item for item in reversed(self.frames[:-1]) if item is not None), None)
        about = outer.about if outer is not None else self.heading
        return Item(kind, about, about != self.heading, marker)

    def set_item(self, item: Item | None) -> None:
        """``item`` (None: none) in place of the item open at this ``.RS`` depth, which ends."""
        self.flush()
        self._close(self.frames[-1])
        self.frames[-1] = item

    def start_paragraph(self) -> None:
        """A paragraph macro (``.PP``): the item at this depth ends."""
        self.end_capture()
        self.set_item(None)

    def indent(self) -> None:
        """``.RS``: a depth in, where no item is open yet."""
        self.settle()
        self.frames.append(None)

    def outdent(self, keep: int | None = None) -> None:
        """``.RE``: back out to ``keep`` depths (at least 1; None: one depth
        out), the items of the depths left ending."""
        keep = len(self.frames) - 1 if keep is None else keep
        while len(self.frames) > max(1, keep):
            self._close(self.frames.pop())

    def reset(self) -> None:
        """Back to the margin (a heading): every item ends."""
        self.flush()
        while self.frames:
            self._close(self.frames.pop())
        self.frames = [None]

    def _described(self) -> None:
        """Every open item has a description now (what is being written)."""
        for item in self.frames:
            if item is not None:
                item.described = True

    def _close(self, item: Item | None) -> None:
        """An item ends: a term that got no description is a unit itself."""
        if item is not None and not item.described:
            for (a, _), term in zip(item.term_spans, item.terms):
                self.unit(a, term, "definition", item.about)
