"""The units of an AsciiDoc text (as git's manual pages write it), read in
one pass of its lines on top of :class:`~.markup_reader.MarkupReader`:
labelled lists (``term::`` over its description, several terms one item,
blocks attached with ``+``, lists nested by their markers), delimited
blocks (listing and literal blocks are code; comment and passthrough
blocks hold no units; open, example, sidebar and quote blocks hold blocks
that belong to the item they are attached to), tables (``|===``), block
titles, literal paragraphs, and paragraphs that go on over any line that
starts no block.

Does not: read AsciiDoc's inline markup, attributes' values or includes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .asciidoc_syntax import (ADOC_ATTRIBUTE, ADOC_BLOCK_ATTRIBUTE, ADOC_BLOCK_TITLE, ADOC_PREPROCESSOR, Delimiters,
                              adoc_block, adoc_term)
from .markup_reader import MarkupReader
from .markup_syntax import ITEM, UNDERLINE, table_header


@dataclass
class _LabelledItem:
    """An open AsciiDoc labelled list item (or, with ``marker`` "", a
    delimited block attached to one, which items inside it do not close)."""

    marker: str
    terms: list[str] = field(default_factory=list)

    @property
    def about(self) -> str:
        return ", ".join(self.terms)


class AsciidocReader(MarkupReader):
    """One pass over the lines of an AsciiDoc text: see :func:`.markup.read_markup`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delimiters = Delimiters(self.lines)
        # The open labelled list items, innermost last, and where the list stands: "terms" (a term
        # was read, its description comes next, blank lines or not), "desc" (in the description's first
        # block), "attach" (after a "+": the next block is the item's), "closed" (after a blank line).
        self.items: list[_LabelledItem] = []
        self.state: str | None = None
        self.closers: list[tuple[int, bool]] = []  # open delimited blocks: (closing line, whether an item's)
        self.block: tuple[int, str, str] | None = None  # a code or quiet block: (closing line, kind, about)

    # -- what encloses a line --------------------------------------------------

    def about(self, offset: int) -> str:
        """What a unit starting at ``offset`` is about: the innermost open item's terms, else the heading."""
        if self.items:
            return self.items[-1].about
        return super().about(offset)

    def defining(self) -> bool:
        """Whether prose here is a definition's description: inside an item."""
        return bool(self.items)

    # -- the pass ------------------------------------------------------------------

    def read_line(self, i: int) -> int:
        """Read the line ``i``, inside a code or quiet block or not: the index of the next line to read."""
        if self.block is not None:
            close, kind, about = self.block
            if i == close:
                self.block = None
                self.state = "closed" if self.items else None
            elif kind == "code" and self.lines[i].strip():
                self.code(i, about)
            return i + 1
        return super().read_line(i)

    def blank_line(self) -> None:
        """A blank line: as in any text, and an item's first block ends (its next may still follow)."""
        super().blank_line()
        if self.state == "desc":
            self.state = "closed"

    def read_title(self, i: int) -> int:
        """A title: as in any text, and every list and block open before it ends."""
        after = super().read_title(i)
        self.items.clear()
        self.closers.clear()
        self.state = None
        return after

    def line(self, i: int, line: str, indent: int) -> int:
        """Read the line ``i`` of an AsciiDoc text (not blank, in no block):
        the index of the next line."""
        start = self.starts[i]
        body = line.strip()
        if body.startswith("//") and not body.startswith("////"):
            return i + 1  # a comment
        if (ADOC_PREPROCESSOR.fullmatch(line) or (indent == 0 and ADOC_ATTRIBUTE.fullmatch(line))
                or (indent == 0 and ADOC_BLOCK_ATTRIBUTE.fullmatch(body))):
            self.flush()  # "ifdef::git-diff[]", ":attr: 1", "[verse]": markup, in the list or not
            return i + 1
        if body == "+":
            self.flush()
            if self.items:
                self.state = "attach"
            return i + 1
        if self.closers and i == self.closers[-1][0]:
            self.close_block()
            return i + 1
        close = self.delimiters.closing(i)
        if close is not None:
            return self.open_block(i, close, body)
        if (term := adoc_term(line)) is not None:
            self.term(i, indent, *term)
            return i + 1
        if self.para is None and indent == 0 and ADOC_BLOCK_TITLE.match(line):
            self.enter()
            self.add(start, start + len(line), "heading", self.about(start))  # ".Example": the next block's title
            return i + 1
        if UNDERLINE.fullmatch(line):
            self.flush()
            return i + 1
        if (table := self.table(i, line, indent)) is not None:
            return table
        return self.paragraph_line(i, line, indent)

    # -- delimited blocks -------------------------------------------------------------

    def open_block(self, i: int, close: int, delimiter: str) -> int:
        """A delimited block opened at line ``i`` and closed at ``close``: the index of the next line to read."""
        self.flush()
        self.enter()
        about = self.about(self.starts[i])
        kind = adoc_block(delimiter)
        if kind in ("code", "quiet"):
            self.block = (close, kind, about)
            return i + 1
        if kind == "table":
            self.adoc_table(i, close, about)
            return close + 1
        # An open, example, sidebar or quote block: its blocks are the item's it is attached to, and
        # the items it holds end with it.
        attached = bool(self.items)
        if attached:
            self.items.append(_LabelledItem("", [self.items[-1].about]))
            self.state = "attach"
        self.closers.append((close, attached))
        return i + 1

    def close_block(self) -> None:
        """An open, example, sidebar or quote block ends, and the items opened inside it."""
        self.flush()
        _, attached = self.closers.pop()
        if attached:
            while self.items and self.items[-1].marker:
                self.items.pop()
            if self.items:
                self.items.pop()  # the block's barrier
        self.state = "closed" if self.items else None

    # -- labelled lists, paragraphs --------------------------------------------------

    def term(self, i: int, indent: int, text: str, marker: str, inline: int | None) -> None:
        """A labelled list item's term (``text``, its ``marker``), read at line ``i``, with its
        description if it starts on the line (at ``inline``)."""
        self.flush()
        if self.state == "terms" and self.items and self.items[-1].marker == marker:
            self.items[-1].terms.append(text)  # "-u::" over "--include-untracked::": one item
        else:
            # A term of an open item's marker is its sibling (the items inside it end); another marker
            # nests a list in the innermost item.
            barrier = max((k for k, it in enumerate(self.items) if not it.marker), default=-1)
            same = next((k for k in range(len(self.items) - 1, barrier, -1) if self.items[k].marker == marker),
                        None)
            if same is not None:
                del self.items[same:]
            self.items.append(_LabelledItem(marker, [text]))
        self.state = "terms"
        if inline is not None:
            self.begin(self.starts[i] + inline, i, indent + 1, "definition", self.items[-1].about, lazy=True)
            self.state = "desc"

    def paragraph_line(self, i: int, line: str, indent: int) -> int:
        """A line of a paragraph or list item, a new one or not, or a literal paragraph's first line:
        the index of the next line to read."""
        start, para = self.starts[i], self.para
        item = ITEM.match(line) is not None
        if para is not None and not item:
            para.end = start + len(line)  # AsciiDoc's paragraphs and items go on over any line that starts no block
            return i + 1
        self.enter(indent)
        if not item and indent > 0 and not self.items:
            self.flush()  # a literal paragraph: code up to a blank line
            k = i
            about = self.about(start)
            while k < len(self.lines) and self.lines[k].strip():
                self.code(k, about)
                k += 1
            return k
        kind = "item" if item else "definition" if self.items else "text"
        self.begin(start, i, 0, kind, self.about(start), lazy=True)
        return i + 1

    def enter(self, indent: int = 0) -> None:
        """A block starts: it is the open item's where it may be, else the list ends."""
        if not self.items:
            return
        if self.state in ("terms", "attach", "desc") or (self.state == "closed" and indent > 0):
            self.state = "desc"
            return
        while self.items and self.items[-1].marker:  # a block at the margin after a blank line ends the list
            self.items.pop()
        self.state = "attach" if self.items else None  # inside an attached block its blocks stay the item's

    def adoc_table(self, i: int, close: int, about: str) -> None:
        """An AsciiDoc table (``|===``) from line ``i`` to ``close``: each row line one unit, about the
        first row when a blank line sets it apart as the header."""
        lines = self.lines
        rows = [k for k in range(i + 1, close) if lines[k].strip()]
        if rows and rows[0] + 1 < close and not lines[rows[0] + 1].strip() and len(rows) > 1:
            about = table_header([lines[rows[0]].strip().strip("|").split("|")]) or about
            rows = rows[1:]
        for k in rows:
            self.add(self.starts[k], self.starts[k] + len(lines[k]), "row", about)
