"""HTML: the text a browser shows (no scripts, styles or markup), one block
per paragraph, with the page's ``<title>`` and its ``<h1>``-``<h6>``
headings for the outline, and the page's own units (see :class:`Unit`),
each about what it is about:

- a heading, about its parent heading;
- each sentence of a paragraph ("text"), about the nearest heading;
- a list item whole ("item"; a nested list's items are their own units);
- each paragraph of a definition list's ``<dd>`` ("definition"), about its
  ``<dt>`` term(s); lists, tables and code inside a ``<dd>`` are about the
  term too (Sphinx API entries and DocBook variable lists are such lists);
- a table row as one line ("row"): ``Header: cell; Header: cell`` under a
  header row, cells joined with `` | `` without one; about the caption;
- each line of a ``<pre>`` block ("code").

EPUB chapters are read with it too. The page is read in two linear passes:
the first tidies the markup into well-nested elements (closing what HTML
lets authors leave open, dropping what is hidden), the second writes the
text with its whitespace collapsed, so every offset is known as it is
written.

Does not: run scripts, apply style sheets (an element is hidden by its tag,
its ``hidden`` attribute, or Sphinx's permalink and line-number classes),
follow links or read other formats.
"""

from __future__ import annotations

from html.parser import HTMLParser

from .document import LoadedDocument, Unit
from .tables import header_text, row_text
from .text import decode_text
from .units import sentences, stripped

HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})

MAX_ABOUT_CHARS = 200  # a unit's ``about`` (a term, a caption, a heading): a line, not a paragraph
LABEL_WORDS = 16  # a one-row table this short labels the prose after it (see _Reader._label)
# A table whose cell holds more text than this is a page laid out in a
# table, not data: its cells are read as blocks, not as one line per row.
LAYOUT_CELL_CHARS = 2000
_SCOPE_LIMIT = 64  # how far down the open elements an implied or explicit end tag looks (keeps hostile pages linear)

_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_HIDDEN = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe", "object"})
_HIDDEN_CLASSES = frozenset({"headerlink", "linenos", "linenodiv"})  # Sphinx: ¶ permalinks, code line numbers
_HEAD_CONTENT = frozenset({"title", "meta", "link", "base", "script", "style", "noscript", "template"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                   "track", "wbr"})
# The elements whose bounds matter: blocks, lists, tables. Inline elements
# (a, span, code, b...) only carry text and are not tracked.
_TRACKED = _HEADINGS | frozenset({
    "address", "article", "aside", "blockquote", "caption", "center", "dd", "details", "dialog", "dir", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "header", "hgroup", "hr", "legend", "li",
    "main", "menu", "nav", "ol", "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead",
    "tr", "ul",
})
_TABLE_PARTS = frozenset({"table", "thead", "tbody", "tfoot", "tr", "td", "th"})
# A start tag closes the open element it may not sit in (HTML's implied end
# tags): tag -> (what it closes, what may lie open above that).
_IMPLIED = {
    "li": (frozenset({"li"}), frozenset({"p", "div", "address"})),
    "dt": (frozenset({"dt", "dd"}), frozenset({"p", "div", "address"})),
    "dd": (frozenset({"dt", "dd"}), frozenset({"p", "div", "address"})),
    "tr": (frozenset({"tr"}), _TRACKED - {"table", "thead", "tbody", "tfoot"}),
    "td": (frozenset({"td", "th"}), _TRACKED - {"table", "thead", "tbody", "tfoot", "tr"}),
    "th": (frozenset({"td", "th"}), _TRACKED - {"table", "thead", "tbody", "tfoot", "tr"}),
    "thead": (frozenset({"thead", "tbody", "tfoot"}), _TRACKED - {"table"}),
    "tbody": (frozenset({"thead", "tbody", "tfoot"}), _TRACKED - {"table"}),
    "tfoot": (frozenset({"thead", "tbody", "tfoot"}), _TRACKED - {"table"}),
}
_CLOSES_P = _TRACKED - {"caption", "td", "th", "tr", "thead", "tbody", "tfoot"}  # blocks that end an open <p>
# An end tag does not reach past these to close an element below them.
_END_SCOPE_CELL = frozenset({"table", "td", "th", "caption"})
_END_SCOPE = {
    "li": _END_SCOPE_CELL | {"ul", "ol"},
    "dt": _END_SCOPE_CELL | {"dl"},
    "dd": _END_SCOPE_CELL | {"dl"},
    "td": frozenset({"table"}), "th": frozenset({"table"}), "tr": frozenset({"table"}),
    "thead": frozenset({"table"}), "tbody": frozenset({"table"}), "tfoot": frozenset({"table"}),
    "caption": frozenset({"table"}), "table": frozenset(),
}

# Pass 1's events.
_OPEN, _CLOSE, _TEXT, _BREAK, _SPACE = range(5)


class _TableInfo:
    """What pass 1 learns of a table before pass 2 reads it: whether it lays
    out a page (holds a heading, a ``<pre>``, another table, or a cell of
    over ``LAYOUT_CELL_CHARS``) rather than holding data."""

    __slots__ = ("cell_chars", "layout")

    def __init__(self) -> None:
        self.layout = False
        self.cell_chars = 0


class _Tidy(HTMLParser):
    """Pass 1: the page as well-nested events. ``events`` holds
    ``(_OPEN, tag, info)`` and ``(_CLOSE, tag)`` for the tracked elements
    (each open closed once, innermost first), ``(_TEXT, data)`` for visible
    text, ``(_BREAK,)`` for ``<br>`` and ``(_SPACE,)`` for a block inside a
    heading (read as a space). ``info`` is a :class:`_TableInfo` for a table,
    a cell's column span for ``td``/``th``, else None. Hidden elements give
    no events; the ``<title>`` gives events only when ``show_title``."""

    def __init__(self, show_title: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.events: list[tuple] = []
        self.title: list[str] = []
        self._show_title = show_title
        self._open: list[str] = []  # the tracked elements open, innermost last
        self._tables: list[_TableInfo] = []  # the tables open, innermost last
        # The hidden element open (its content is dropped), and how deep it
        # nests in itself: nothing else opens inside it.
        self._hidden: str | None = None
        self._hidden_depth = 0
        self._in_title = False
        self._title_seen = False
        self._swallowed: dict[str, int] = {}  # blocks open inside the open heading, read as inline

    # -- the parser's callbacks ------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._in_title:
            return  # a title holds text only
        if tag == "title" and not self._title_seen and self._hidden in (None, "head"):
            self._in_title = self._title_seen = True
            if self._show_title:
                self.events.append((_OPEN, "title", None))
            return
        if self._hidden:
            if self._hidden == "head" and tag not in _HEAD_CONTENT:
                self._hidden = None  # the body began where </head> was left out
            else:
                if tag == self._hidden and tag not in _VOID:
                    self._hidden_depth += 1  # nested in itself: its end tag must not show the outer one
                return
        if tag in _HIDDEN or _hides(attrs):
            if tag not in _VOID:
                self._hidden, self._hidden_depth = tag, 1
            return
        if tag == "br":
            self.events.append((_BREAK,))
        elif tag in _TRACKED:
            self._start(tag, attrs)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # XHTML's <br/> is one break, its <p/> an empty paragraph.
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._in_title:
            if tag == "title":
                self._in_title = False
                if self._show_title:
                    self.events.append((_CLOSE, "title"))
            return
        if self._hidden:
            if tag == self._hidden:
                self._hidden_depth -= 1
                if not self._hidden_depth:
                    self._hidden = None
                return
            if tag not in _TRACKED or self._hidden in _HIDDEN or self._hidden in _TRACKED:
                return
            # An inline element hidden by its class (a permalink) left open:
            # the end of a block around it ends it.
            self._hidden = None
        if tag == "br":
            self.events.append((_BREAK,))  # browsers read </br> as <br>
        elif tag in _TRACKED and tag not in _VOID:
            if self._swallowed.get(tag):
                self._swallowed[tag] -= 1
                self.events.append((_SPACE,))
            else:
                self._end(tag)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
            if self._show_title:
                self.events.append((_TEXT, data))
        elif not self._hidden:
            if self._tables:
                table = self._tables[-1]
                table.cell_chars += len(data)
                if table.cell_chars > LAYOUT_CELL_CHARS:
                    table.layout = True
            self.events.append((_TEXT, data))

    def close(self) -> None:
        """Ends the page: everything still open is closed."""
        super().close()
        if self._in_title:
            self.handle_endtag("title")
        self._pop_to(0)

    # -- keeping the elements well nested -------------------------------------

    def _start(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._open and self._open[-1] in _HEADINGS:
            if tag not in _HEADINGS:
                # A heading holds a line: a block inside it is read as inline.
                if tag not in _VOID:
                    self._swallowed[tag] = self._swallowed.get(tag, 0) + 1
                self.events.append((_SPACE,))
                return
            self._pop_to(len(self._open) - 1)  # a heading closes the open heading
        if tag in _CLOSES_P and self._open and self._open[-1] == "p":
            self._pop_to(len(self._open) - 1)
        if tag in _IMPLIED:
            closes, passes = _IMPLIED[tag]
            self._close_within(closes, passes)
        if self._tables and (tag == "table" or tag == "pre" or tag in _HEADINGS):
            self._tables[-1].layout = True
        info: object = None
        if tag == "table":
            info = _TableInfo()
            self._tables.append(info)
        elif tag in ("td", "th"):
            info = _colspan(attrs)
            if self._tables:
                self._tables[-1].cell_chars = 0
        self._open.append(tag)
        self.events.append((_OPEN, tag, info))
        if tag in _VOID:  # <hr>: a block with nothing in it
            self._pop_to(len(self._open) - 1)

    def _end(self, tag: str) -> None:
        """Closes the open ``tag`` and all above it, unless a scope boundary
        (a table cell for a paragraph, a list for an item) lies between."""
        stops = _END_SCOPE.get(tag, _END_SCOPE_CELL)
        for depth in range(len(self._open) - 1, max(len(self._open) - _SCOPE_LIMIT, 0) - 1, -1):
            node = self._open[depth]
            if node == tag:
                self._pop_to(depth)
                return
            if node in stops:
                return  # a stray end tag: ignored, as browsers do

    def _close_within(self, closes: frozenset[str], passes: frozenset[str]) -> None:
        """Closes the nearest open element of ``closes`` when only elements of
        ``passes`` lie open above it (a new ``<li>`` closes the open item)."""
        for depth in range(len(self._open) - 1, max(len(self._open) - _SCOPE_LIMIT, 0) - 1, -1):
            node = self._open[depth]
            if node in closes:
                self._pop_to(depth)
                return
            if node not in passes:
                return

    def _pop_to(self, depth: int) -> None:
        """Closes the open elements from the innermost down to ``depth``."""
        while len(self._open) > depth:
            tag = self._open.pop()
            if tag == "table":
                self._tables.pop()
            elif tag in _HEADINGS:
                self._swallowed.clear()
            self.events.append((_CLOSE, tag))


def _hides(attrs: list[tuple[str, str | None]]) -> bool:
    """Whether an element's attributes hide it: ``hidden``, or a class a
    browser never shows (Sphinx's permalinks are shown only on hover)."""
    for name, value in attrs:
        if name == "hidden" or (name == "class" and value and not _HIDDEN_CLASSES.isdisjoint(value.split())):
            return True
    return False


def _colspan(attrs: list[tuple[str, str | None]]) -> int:
    """A cell's ``colspan``, 1 to 100 (1 when absent or not a number)."""
    for name, value in attrs:
        if name == "colspan":
            try:
                return min(max(int(value or 1), 1), 100)
            except ValueError:
                return 1
    return 1


class _Writer:
    """The page's text, written piece by piece with its whitespace collapsed
    as a browser shows it: runs of spaces become one, nothing leads or
    trails, and blocks are apart by at most one blank line. What a piece of
    text lands at is known when it is written."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self._breaks = 0  # line breaks owed before the next word (at most 2: a blank line)
        self._space = False  # a space owed before the next word

    def gap(self, lines: int) -> None:
        """Owes ``lines`` line breaks (1 or 2) before the next word, unless more are owed."""
        self._breaks = max(self._breaks, lines)

    def newline(self) -> None:
        """Owes one more line break (a ``<br>``, a line of ``<pre>``), at most a blank line."""
        self._breaks = min(self._breaks + 1, 2)

    def space(self) -> None:
        """Owes a space before the next word."""
        self._space = True

    def text(self, data: str) -> tuple[int, int] | None:
        """Writes ``data``'s words, one space apart; ``(start, end)`` of
        what was written, None when it held no word."""
        words = data.split()
        if not words:
            self._space = self._space or bool(data)
            return None
        if self.length:
            if self._breaks:
                self._put("\n" * self._breaks)
            elif self._space or data[0].isspace():
                self._put(" ")
        self._breaks, self._space = 0, data[-1].isspace()
        start = self.length
        self._put(" ".join(words))
        return start, self.length

    def _put(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)


class _Table:
    """A data table as pass 2 reads it: its header cells, its caption, the
    cells of the row being read."""

    def __init__(self) -> None:
        self.headers: list[str] = []
        self.caption = ""
        self.in_head = False
        self.body_rows = 0
        self.row: list[tuple[str, bool, int]] = []  # (text, is <th>, column span)


class _Terms:
    """The terms of a definition list's item being read: the ``<dt>``s so
    far, and whether a ``<dd>`` followed them (then the next ``<dt>``
    starts the next item)."""

    __slots__ = ("described", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.described = False


class _Context:
    """A unit being written: its kind, where its text so far starts and
    ends (None before its first word), and its ``about`` (None: the nearest
    term or heading when the unit ends)."""

    __slots__ = ("about", "end", "kind", "start")

    def __init__(self, kind: str, about: str | None = None) -> None:
        self.kind, self.start, self.end, self.about = kind, None, None, about


class _Reader:
    """Pass 2: writes the text of pass 1's events and finds the headings and
    the units in it. Units are written as spans first; ``units`` splits the
    prose ones into sentences once the text is whole."""

    def __init__(self) -> None:
        self.out = _Writer()
        self.headings: list[tuple[int, int, str]] = []
        self.spans: list[tuple[int, int, str, str]] = []  # (start, end, kind, about), kind "text" split later
        self._contexts = [_Context("text")]  # the units open, innermost last; the page's prose at the bottom
        self._frames: list[tuple] = []  # what each open element began, to end it at its close
        self._path: list[tuple[int, str]] = []  # the headings above, (level, name), outermost first
        self._heading = ""  # the nearest heading above
        self._terms: list[str] = []  # the terms of the <dd>s open, innermost last
        self._lists = [_Terms()]  # per <dl> open, innermost last (a stray <dt> or <dd> uses the first)
        self._tables: list[_Table | None] = []  # the tables open (None: a layout table)
        self._captures: list[list[str]] = []  # the text of the headings, terms and captions being read
        self._cell: list[str] | None = None  # the text of the data-table cell being read
        self._pre = 0  # how many <pre> are open
        # A data table of one short row with no header, written before prose, labels that prose up to the
        # next heading or table: a reference of options written so (DocBook's and Exim's "option | Use: main
        # | Type: integer | Default: 50M" over the option's paragraphs) gives each paragraph what it is about.
        self._label = ""
        self._last_row = ""  # the line of the last row of the data table being read

    def read(self, events: list[tuple]) -> None:
        """Reads pass 1's events in order."""
        for event in events:
            kind = event[0]
            if kind == _TEXT:
                self._text(event[1])
            elif kind == _OPEN:
                self._frames.append(self._open(event[1], event[2]))
            elif kind == _CLOSE:
                self._close(self._frames.pop())
            elif kind == _BREAK:
                self._break()
            else:
                self._put_space()

    def units(self, text: str) -> tuple[Unit, ...]:
        """The page's units in ``text`` (what ``out`` wrote): the prose
        spans split into sentences, every unit stripped, those holding no
        word left out."""
        units: list[Unit] = []
        for start, end, kind, about in self.spans:
            for a, b in sentences(text, start, end) if kind == "text" else ((start, end),):
                if (span := stripped(text, a, b)) is not None:
                    units.append(Unit(span[0], span[1], kind, about))
        return tuple(units)

    # -- text ------------------------------------------------------------------

    def _text(self, data: str) -> None:
        if self._pre and self._cell is None:
            # In <pre> each line is a line, and a unit of its own.
            lines = data.split("\n")
            self._put(lines[0])
            for line in lines[1:]:
                self._line_break()
                self._put(line)
        else:
            self._put(data)

    def _put(self, data: str) -> None:
        for capture in self._captures:
            capture.append(data)
        if self._cell is not None:
            self._cell.append(data)
            return
        span = self.out.text(data)
        if span is not None:
            context = self._contexts[-1]
            if context.start is None:
                context.start = span[0]
            context.end = span[1]

    def _put_space(self) -> None:
        for capture in self._captures:
            capture.append(" ")
        if self._cell is not None:
            self._cell.append(" ")
        else:
            self.out.space()

    def _break(self) -> None:
        if self._pre and self._cell is None:
            self._line_break()
        elif self._cell is not None or self._captures:
            self._put_space()
        else:
            self.out.newline()

    def _line_break(self) -> None:
        if self._contexts[-1].kind == "code":
            self._flush()
        for capture in self._captures:
            capture.append(" ")
        self.out.newline()

    def _block(self) -> None:
        """A block's bound: a blank line; a paragraph of prose or of a
        definition ends there (a list item does not: it is one unit whole)."""
        if self._cell is not None:
            self._put_space()
            return
        if self._contexts[-1].kind in ("text", "definition", "code"):
            self._flush()
        for capture in self._captures:
            capture.append(" ")
        self.out.gap(2)

    # -- units -------------------------------------------------------------------

    def _about(self) -> str:
        """What a unit here is about: the innermost definition's term, else
        the label table above it, else the nearest heading."""
        return self._terms[-1] if self._terms else self._label or _clip(self._heading)

    def _begin(self, kind: str, about: str | None = None) -> None:
        """Starts a unit inside the one being written, which ends here (and
        goes on as a new unit after this one)."""
        self._flush()
        self._contexts.append(_Context(kind, about))

    def _end(self) -> _Context:
        self._flush()
        return self._contexts.pop()

    def _flush(self) -> None:
        """Ends the piece of the innermost unit written so far."""
        context = self._contexts[-1]
        if context.start is not None:
            if context.kind != "term":  # a term is its definition's about, not a unit
                about = context.about if context.about is not None else self._about()
                # Prose under a label table is its description: a paragraph whole, as a definition's.
                kind = "definition" if context.kind == "text" and self._label and not self._terms else context.kind
                self.spans.append((context.start, context.end, kind, about))
            context.start = None

    def _capture(self) -> None:
        self._captures.append([])

    def _captured(self) -> str:
        return " ".join("".join(self._captures.pop()).split())

    # -- elements ------------------------------------------------------------------

    def _open(self, tag: str, info: object) -> tuple:
        """Begins element ``tag``; returns what :meth:`_close` needs to end it."""
        table = self._tables[-1] if self._tables else None
        if table is not None and (self._cell is not None or tag in _TABLE_PARTS or tag == "caption"):
            return self._open_in_table(table, tag, info)
        self._block()
        if tag in _HEADINGS or tag == "title":
            level = int(tag[1]) if tag != "title" else 0
            while level and self._path and self._path[-1][0] >= level:
                self._path.pop()
            self._begin("heading", _clip(self._path[-1][1]) if level and self._path else "")
            self._capture()
            return ("heading", level)
        if tag == "li":
            self._begin("item")
            return ("unit",)
        if tag == "pre":
            self._pre += 1
            self._begin("code")
            return ("pre",)
        if tag == "dl":
            self._lists.append(_Terms())
            return ("dl",)
        if tag == "dt":
            if self._lists[-1].described:
                self._lists[-1] = _Terms()  # a term after a description starts the next item
            self._begin("term")
            self._capture()
            return ("dt",)
        if tag == "dd":
            terms = self._lists[-1]
            terms.described = True
            self._terms.append(_clip(", ".join(terms.names)) or self._about())
            self._begin("definition")
            return ("dd",)
        if tag == "table":
            layout = not isinstance(info, _TableInfo) or info.layout
            self._label = ""
            self._tables.append(None if layout else _Table())
            if not layout:
                self._begin("text")  # text astray between rows is prose
            return ("table", layout)
        return ("block",)

    def _open_in_table(self, table: _Table, tag: str, info: object) -> tuple:
        """Begins ``tag`` inside a data table: a row, a cell, a header
        section, the caption; any block inside a cell is a space in it."""
        if self._cell is not None:
            self._put_space()
            return ("cell block",)
        if tag == "tr":
            table.row = []
            return ("tr", table)
        if tag in ("td", "th"):
            self._cell = []
            return ("cell", table, tag == "th", info if isinstance(info, int) else 1)
        if tag == "thead":
            table.in_head = True
            return ("thead", table)
        if tag == "caption":
            self._block()
            self._begin("text")
            self._capture()
            return ("caption", table)
        return ("nothing",)  # tbody, tfoot: nothing of their own

    def _close(self, frame: tuple) -> None:
        """Ends the element that :meth:`_open` began with ``frame``."""
        what = frame[0]
        if what == "nothing":
            return
        if what == "cell block":
            self._put_space()
            return
        if what == "cell":
            text = " ".join("".join(self._cell or ()).split())
            self._cell = None
            frame[1].row.append((text, frame[2], frame[3]))
            return
        if what == "tr":
            self._row(frame[1])
            return
        if what == "thead":
            frame[1].in_head = False
            return
        if what == "heading":
            self._close_heading(frame[1])
        elif what == "pre":
            self._end()
            self._pre -= 1
        elif what == "unit":
            self._end()
        elif what == "dl":
            self._lists.pop()
        elif what == "dt":
            self._end()
            if term := self._captured():
                self._lists[-1].names.append(term)
        elif what == "dd":
            self._end()
            self._terms.pop()
        elif what == "table":
            if not frame[1]:
                self._end()
            table = self._tables.pop()
            if (table is not None and table.body_rows == 1 and not table.headers and not table.caption
                    and not self._tables and not self._terms and len(self._last_row.split()) <= LABEL_WORDS):
                self._label = self._last_row
        elif what == "caption":
            self._end()
            frame[1].caption = _clip(self._captured())
        self._block()

    def _close_heading(self, level: int) -> None:
        """Ends a heading (level 0: the title): a unit, and for h1-h6 the
        outline's next entry and the nearest heading from here on."""
        start = self._contexts[-1].start
        self._end()
        name = self._captured()
        if level and name and start is not None:
            self.headings.append((start, level, name))
            self._path.append((level, name))
            self._heading = name
            self._label = ""

    def _row(self, table: _Table) -> None:
        """Writes the row just read as one line and one unit: a header row
        as ``A | B`` (kept as the table's headers), a row under it as
        ``A: x; B: y``, a row of a table without one as ``x | y``."""
        cells, table.row = table.row, []
        texts = [text for text, _, _ in cells if text]
        if not texts:
            return
        if table.in_head or (all(is_th for _, is_th, _ in cells) and not table.body_rows):
            if len(cells) == 1 and cells[0][2] > 1:
                table.caption = table.caption or _clip(texts[0])  # a title over all columns, not a header
            else:
                table.headers = [text for text, _, span in cells for _ in range(span)]  # a header spans its columns
            line = header_text(texts)
        else:
            table.body_rows += 1
            columns = [text if i == 0 else "" for text, _, span in cells for i in range(span)]
            line = row_text(table.headers, columns) if table.headers else " | ".join(texts)
        self._flush()
        self.out.gap(1)
        self._last_row = line
        span = self.out.text(line)
        if span is not None:
            self.spans.append((span[0], span[1], "row", table.caption or self._about()))


def _clip(text: str) -> str:
    """``text`` cut to ``MAX_ABOUT_CHARS``, with an ellipsis when cut."""
    return text if len(text) <= MAX_ABOUT_CHARS else text[: MAX_ABOUT_CHARS - 1].rstrip() + "…"


def parse_html(html: str, *, show_title: bool = True) -> LoadedDocument:
    """The visible text of an HTML page with its title, headings and units
    (see the module's docstring; offsets into the returned text); the title
    is part of the text, as a heading unit, unless ``show_title`` is False
    (an EPUB chapter's title repeats its heading).

    ``parse_html("<h1>A</h1><p>b</p>").headings -> ((0, 1, "A"),)``;
    its units: ``Unit(0, 1, "heading", "")``, ``Unit(3, 4, "text", "A")``
    """
    tidy = _Tidy(show_title)
    tidy.feed(html)
    tidy.close()
    reader = _Reader()
    reader.read(tidy.events)
    text = "".join(reader.out.parts)
    title = " ".join("".join(tidy.title).split()) or None
    return LoadedDocument(text, title=title, headings=tuple(reader.headings), units=reader.units(text))


def html_to_text(html: str) -> str:
    """The visible text of an HTML page, one block per paragraph.

    ``"<p>a <b>b</b></p><script>x()</script>" -> "a b"``
    """
    return parse_html(html).text


def load_html(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """An HTML file: its visible text, title, headings and units."""
    return parse_html(decode_text(source, data))
