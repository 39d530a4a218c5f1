"""Plain text, Markdown, reStructuredText and AsciiDoc read once, whole, at
ingest: the section headings of the outline and the document's own units,
each with what it is about.

The units (see :class:`~.document.Unit`):

- a heading ("heading", about its parent heading);
- an API directive's signature with its continuation lines (``.. function::
  wrap(text, width=70, \\`` ...: "signature", about what encloses the
  directive); what the directive's body holds is about that signature,
  joined to one line;
- the description of a definition item: an AsciiDoc labelled list's
  (``term::``, ``term;;``, several terms on consecutive lines joined ", ",
  blocks attached with ``+``), a reStructuredText definition list's (a
  term over its indented description), field list's (``:name: body``) and
  option list's (``-f FILE, --file=FILE  Read it.``), Markdown's ``Term``
  over ``: description``: each paragraph one "definition", about the terms;
- a list item, its continuation lines included ("item");
- a table's body row ("row"): a Markdown pipe table's, a reStructuredText
  grid or simple table's (a grid row over several lines whole), about the
  header (its cells joined " | "; about what encloses the table when it has
  none); a ``header: value; ...`` row, which says its headers itself, about
  what encloses it;
- a code line ("code"): in a fence, a doctest, a literal block after
  ``::``, a code directive's body, an AsciiDoc listing or literal block;
- else prose, split into sentences ("text").

What encloses a unit: the innermost definition item or API directive it lies
in (by indentation in reStructuredText and plain text; by AsciiDoc's list
rules), else the nearest heading above it ("" if none).

The dialect is Markdown by the file's suffix; reStructuredText for ``.rst``
or a text with directives or roles; AsciiDoc for a text with a labelled
list's term over its description, a list continuation (a lone ``+``), a
preprocessor line (``ifdef::x[]``), an ``== Title``, a block attribute
(``[source,sh]``, ``[[anchor]]``) or a ``linkgit:``; else plain text, read
by reStructuredText's indentation rules. In AsciiDoc ``term::`` over a blank
line is a term (its description may follow a blank line); elsewhere it
introduces a literal block.

Every pattern here runs over one line, or is matched by hand where a
pattern would backtrack over a long line; the text is read in one pass of
its lines, with lookups by bisection.

Does not: render markup (units are spans of the text as written) or decode files.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Sequence

from .document import Unit
from .units import Headings, sentences, stripped

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
DIALECTS = ("markdown", "rst", "asciidoc", "plain")

_UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>:._])\1{2,}[ \t]*")
_ATX_OPEN = re.compile(r"(#{1,6})[ \t]+")  # the rest of the line is cut by hand: see _atx
_ADOC_TITLE_OPEN = re.compile(r"(={1,6})[ \t]+")  # AsciiDoc's "== Title", cut by hand as well
_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")
# :mod:`bisect` -> bisect; a role's name is one or two words (":py:func:"), so a run of colons costs a step each.
_ROLE = re.compile(r":(?:[\w.+-]+:){1,2}`([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`_{0,2}|\*\*(.+?)\*\*|\*(.+?)\*")
# A heading (or a term, or a signature) is cut to this many characters before
# it is cleaned: the patterns above backtrack quadratically over a long enough
# line, and a chunk's context keeps far fewer (MAX_CONTEXT_CHARS).
MAX_HEADING_CHARS = 1000
MAX_TABLE_LINES = 2000  # a simple table's closing border is looked for this far

_DIRECTIVE = re.compile(r"([ \t]*)\.\.[ \t]+([\w:.-]+)::[ \t]*(.*)")
_API = re.compile(r"(?:\w+:)?(?:function|decorator|class|method|classmethod|staticmethod|decoratormethod|attribute"
                  r"|property|data|exception|module|cmdoption|option|envvar|describe|opcode|type|member|macro"
                  r"|coroutinefunction|coroutinemethod|abstractmethod|awaitablefunction|awaitablemethod)")
_CODE_DIRECTIVES = frozenset({"code-block", "sourcecode", "code", "testcode", "testoutput", "doctest", "testsetup",
                              "testcleanup", "productionlist", "highlight-block"})
# Directives whose argument is a name or a path, not words of the document: no unit.
_QUIET_DIRECTIVES = frozenset({"index", "highlight", "toctree", "image", "figure", "include", "literalinclude",
                               "only", "tabularcolumns", "raw", "currentmodule", "default-role", "role",
                               "sectionauthor", "moduleauthor", "program", "audit-event-table", "csv-table",
                               "list-table", "table", "contents", "sectnum", "footer", "header", "meta",
                               "default-domain", "ifconfig", "cssclass", "glossary", "autosummary"})
_QUIET_BODIES = frozenset({"index", "toctree", "raw", "meta", "tabularcolumns"})  # their bodies are no prose either
_OPTION = re.compile(r"[ \t]+:[\w -]+:(?:[ \t].*)?")  # a directive's option, ":synopsis: ..."
_ITEM = re.compile(r"[ \t]*(?:[-*+\u2022]|\d{1,3}[.)]|#\.)[ \t]+\S")
_PAIR = r"[^\s:;][^:;\n]{0,59}: [^;\n]*"
_ROW = re.compile(rf"[ \t]*{_PAIR}(?:; {_PAIR})+")  # a sheet's row: "City: Oslo; Pop: 700k"
_GRID = re.compile(r"[ \t]*[|+].*[|+][ \t]*")  # a table's line: "| *level* | Set the root ... |"
_GRID_BORDER = re.compile(r"[ \t]*\+(?:[-=]+\+)+[ \t]*")  # "+-----+-----+", "+=====+"
_SIMPLE_BORDER = re.compile(r"[ \t]*=+(?:[ \t]+=+)+[ \t]*")  # "=====  =====  ======"
_PIPE_CELL = re.compile(r":?-+:?")  # a Markdown table's delimiter cell
_FIELD = re.compile(r"[ \t]*:(?![ \t])([^:`\n]+?)(?<![ \t]):(?=[ \t]|$)[ \t]*")  # ":Author: Me", ":param x: ..."
_OPTIONS = re.compile(r"--?\w[\w-]*(?:[ =]<?[\w.-]+>?)?(?:, --?\w[\w-]*(?:[ =]<?[\w.-]+>?)?)*")  # "-f FILE, --file=F"
_FOOTNOTE = re.compile(r"[ \t]*\.\.[ \t]+\[[^\]\s]+\][ \t]+")  # ".. [1] text", ".. [#note] text"
_TARGET = re.compile(r"[ \t]*\.\.[ \t]+_")  # ".. _label: url"
_MD_DEFINITION = re.compile(r":[ \t]+(?=\S)")  # Markdown's "Term" over ": description"
# AsciiDoc: delimited blocks (the closing line repeats the opening one), its
# preprocessor and attribute lines, comments, block attributes and titles.
_ADOC_DELIMITER = re.compile(r"(-{4,}|\.{4,}|={4,}|\*{4,}|_{4,}|/{4,}|\+{4,}|--|\|={3,})[ \t]*")
_ADOC_DELIMITER_FIRST = "-.=*_/+|"
_ADOC_PREPROCESSOR = re.compile(r"(?:ifn?def|endif|ifeval|include)::[^\[\s]*\[.*\][ \t]*")
_ADOC_ATTRIBUTE = re.compile(r":!?[\w-]+!?:(?:[ \t].*)?")  # ":git-diff-core: 1"
_ADOC_BLOCK_ATTRIBUTE = re.compile(r"\[[^\[\]]*\]|\[\[[^\]]*\]\]")  # "[verse]", "[source,sh]", "[[anchor]]"
_ADOC_BLOCK_TITLE = re.compile(r"\.[\w`'\"*_]")  # ".Example", at the margin
_ADOC_TERM_INLINE = re.compile(r"(?::{2,4}|;;)[ \t]+(?=\S)")  # "'%n':: newline"
# What says a text is reStructuredText, or AsciiDoc (a term over its definition, a list continuation, a
# conditional or include line, a link to a git manual page).
_RST_SIGNS = re.compile(r"^[ \t]*\.\.[ \t]+[\w:.-]+::|:(?:func|mod|class|meth|ref|doc|attr|exc|data|term|option):`",
                        re.MULTILINE)
_ADOC_SIGNS = re.compile(r"^(?:[^\s.][^\n]*(?:::|;;)[ \t]*\n[ \t]*\S|\+[ \t]*\n\S|(?:ifn?def|endif|include)::\S*\["
                         r"|={1,5} \S|\[(?:source|verse|NOTE|TIP|WARNING|IMPORTANT|CAUTION|listing|literal|quote)\b"
                         r"|\[\[[\w-]+\]\][ \t]*$)|linkgit:", re.MULTILINE)
_ADOC_LEVELS = {"=": 1, "-": 2, "~": 3, "^": 4, "+": 5}


def clean_heading(text: str) -> str:
    """A heading as a reader sees it: roles, literals and emphasis marks
    dropped, `` --- `` as a dash.

    ``clean_heading(":mod:`bisect` --- Array bisection algorithm") -> "bisect — Array bisection algorithm"``
    """
    text = " ".join(text[:MAX_HEADING_CHARS].split())  # first: a regex below backtracks over a run of spaces
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    text = re.sub(r"\s+-{2,3}\s+", " — ", text)
    return " ".join(text.split())


def dialect_of(text: str, suffix: str = ".txt") -> str:
    """Which markup ``text`` is written in: "markdown" (by its suffix),
    "rst", "asciidoc" or "plain" (see the module's notes).

    ``dialect_of("-u::\\n\\tAll untracked files.\\n") -> "asciidoc"``
    """
    suffix = suffix.lower()
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix == ".rst" or _RST_SIGNS.search(text):
        return "rst"
    if _ADOC_SIGNS.search(text):
        return "asciidoc"
    return "plain"


@dataclass(frozen=True)
class Markup:
    """What :func:`read_markup` found: the ``dialect``, the outline
    (``(offset, level, heading)`` in order) and the units in order."""

    dialect: str
    headings: tuple[tuple[int, int, str], ...]
    units: tuple[Unit, ...]


def read_markup(text: str, suffix: str = ".txt") -> Markup:
    """The outline and the units of a ``.txt``, ``.md``, ``.markdown`` or
    ``.rst`` text (its line endings ``\\n``).

    ``read_markup("Usage\\n=====\\n\\nRun it. Then stop.\\n").units`` -> the heading
    "Usage" (about ""), then "Run it." and "Then stop." about "Usage".
    """
    dialect = dialect_of(text, suffix)
    lines = text.split("\n")
    titles = _titles(lines, dialect)
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    headings = tuple((starts[t.first], t.level, t.title) for t in titles)
    units = _Reader(text, lines, starts, titles, headings, dialect).read()
    return Markup(dialect, headings, tuple(units))


def markup_units(text: str, suffix: str = ".txt") -> list[Unit]:
    """The units of a ``.txt``, ``.md``, ``.markdown`` or ``.rst`` text:
    :func:`read_markup`'s.

    ``markup_units("-u::\\n--include-untracked::\\n\\tAll untracked files are stashed.\\n")``
    -> ``[Unit(30, 62, "definition", "-u, --include-untracked")]``
    """
    return list(read_markup(text, suffix).units)


def find_headings(text: str, *, markdown: bool, dialect: str | None = None) -> tuple[tuple[int, int, str], ...]:
    """``(offset, level, heading)`` of the headings of ``text``, in order.

    Headings are the underlined titles of reStructuredText and of Markdown's
    setext form (a line of text over a line of one repeated punctuation
    character at least as long), for Markdown the ``#`` headings outside
    code fences, for AsciiDoc its two-line titles (not overlined; none
    inside a listing or literal block) and ``== Title`` lines. Levels follow
    reStructuredText's rule: each underline style gets the next level the
    first time it is seen (AsciiDoc's are fixed: ``=`` 1, ``-`` 2, ``~`` 3 ...).

    ``find_headings("Title\\n=====\\n\\nBody", markdown=False) -> ((0, 1, "Title"),)``
    """
    dialect = "markdown" if markdown else (dialect or dialect_of(text))
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    return tuple((starts[t.first], t.level, t.title) for t in _titles(lines, dialect))


@dataclass(frozen=True)
class _Title:
    first: int  # its first line (an overline, or the title)
    line: int  # the title's line
    last: int  # its last line (the underline, or the title)
    level: int
    title: str


def _titles(lines: list[str], dialect: str) -> list[_Title]:
    markdown, asciidoc = dialect == "markdown", dialect == "asciidoc"
    styles: list[str] = []  # underline styles in order of first use: their index is the level
    found: list[_Title] = []
    delimiters = _Delimiters(lines) if asciidoc else None
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if markdown and _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            heading = _underlined(lines, i, dialect)
            if heading is not None:
                style, title, first = heading
                if markdown:
                    level = 1 if style == "=" else 2
                elif asciidoc:
                    level = _ADOC_LEVELS[style]
                else:
                    if style not in styles:
                        styles.append(style)
                    level = styles.index(style) + 1
                if title:
                    found.append(_Title(first, i, i + 1, level, title))
                i += 2  # past the underline
                continue
            close = delimiters.closing(i) if delimiters is not None else None
            if close is not None and _adoc_block(line) in ("code", "quiet"):
                i = close + 1  # a listing, literal, comment or passthrough block holds no titles
                continue
            one_line = _atx(line, _ATX_OPEN) if markdown else _atx(line, _ADOC_TITLE_OPEN) if asciidoc else None
            if one_line and (title := clean_heading(one_line[1])):
                found.append(_Title(i, i, i, one_line[0], title))
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
    if not title.strip() or title[0].isspace() or _UNDERLINE.fullmatch(title):
        return None
    under = _UNDERLINE.fullmatch(lines[i + 1])
    if not under or len(lines[i + 1].rstrip()) < len(title.rstrip()):
        return None
    if dialect == "markdown" and under.group(1) not in "=-":
        return None
    if dialect == "asciidoc" and (under.group(1) not in _ADOC_LEVELS
                                  or len(lines[i + 1].rstrip()) > len(title.rstrip()) + 2
                                  or title[0] in "[.+/" or _ADOC_PREPROCESSOR.fullmatch(title)):
        return None
    over = dialect not in ("markdown", "asciidoc") and i > 0 and lines[i - 1].rstrip() == lines[i + 1].rstrip()
    if not over and i > 0 and lines[i - 1].strip() and not (dialect == "asciidoc" and _adoc_markup(lines[i - 1])):
        return None  # a title stands after a blank line (or an overline; in AsciiDoc, an anchor)
    style = ("over" if over else "") + under.group(1)
    return style, clean_heading(title), (i - 1 if over else i)


class _Delimiters:
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
        if (above and not _ADOC_DELIMITER.fullmatch(above) and not _adoc_markup(above)
                and abs(len(above) - len(self._lines[i].rstrip())) <= 2):
            return None
        k = bisect.bisect_right(where, i)
        return where[k] if k < len(where) else None


@dataclass
class _Frame:
    """A block that encloses the lines indented more than ``indent`` under
    it: an API directive or a definition item (``about`` its signature or
    terms), a code block, or markup whose body is no prose ("quiet")."""

    indent: int
    kind: str  # "api", "term", "code" or "quiet"
    about: str | None = None


@dataclass
class _Paragraph:
    start: int
    end: int
    indent: int  # a line indented at least this much goes on with it
    kind: str  # "text" (split into sentences), "item" or "definition"
    about: str
    lazy: bool = False  # whether any line that starts no block goes on with it (Markdown's and AsciiDoc's items)


@dataclass
class _Item:
    """An open AsciiDoc labelled list item (or, with ``marker`` "", a
    delimited block attached to one, which items inside it do not close)."""

    marker: str
    terms: list[str] = field(default_factory=list)

    @property
    def about(self) -> str:
        return ", ".join(self.terms)


class _Reader:
    """One pass over the lines of a text: see :func:`read_markup`."""

    def __init__(self, text: str, lines: list[str], starts: list[int], titles: list[_Title],
                 headings: Sequence[tuple[int, int, str]], dialect: str) -> None:
        self.text, self.lines, self.starts, self.dialect = text, lines, starts, dialect
        self.asciidoc, self.markdown = dialect == "asciidoc", dialect == "markdown"
        self.indented_lists = dialect in ("rst", "plain")  # definition, field and option lists by indentation
        self.titles = {t.first: t for t in titles}
        self.outline = Headings(headings)
        self.parents: dict[int, str] = {}  # a title's first line -> the heading it lies under
        stack: list[tuple[int, str]] = []
        for t in titles:
            while stack and stack[-1][0] >= t.level:
                stack.pop()
            self.parents[t.first] = stack[-1][1] if stack else ""
            stack.append((t.level, t.title))
        self.delimiters = _Delimiters(lines) if self.asciidoc else None
        self.units: list[Unit] = []
        self.frames: list[_Frame] = []
        self.para: _Paragraph | None = None
        self.literal_after: int | None = None  # the indent of a paragraph that ended in "::"
        # AsciiDoc: the open labelled list items, innermost last, and where the list stands: "terms" (a term
        # was read, its description comes next, blank lines or not), "desc" (in the description's first
        # block), "attach" (after a "+": the next block is the item's), "closed" (after a blank line).
        self.items: list[_Item] = []
        self.state: str | None = None
        self.closers: list[tuple[int, bool]] = []  # open delimited blocks: (closing line, whether an item's)
        self.md_term: str | None = None  # Markdown: the term whose ": description"s are being read

    # -- what encloses a line --------------------------------------------------

    def heading(self, offset: int) -> str:
        return self.outline.above(offset)

    def about(self, offset: int) -> str:
        """What a unit starting at ``offset`` inside the current frames is about."""
        if self.asciidoc and self.items:
            return self.items[-1].about
        for frame in reversed(self.frames):
            if frame.about is not None:
                return frame.about
        return self.heading(offset)

    def defining(self) -> bool:
        """Whether prose here is a definition's description."""
        if self.asciidoc:
            return bool(self.items)
        for frame in reversed(self.frames):
            if frame.about is not None:
                return frame.kind == "term"
        return False

    # -- units -------------------------------------------------------------------

    def add(self, start: int, end: int, kind: str, about: str) -> None:
        span = stripped(self.text, start, end)
        if span is not None:
            self.units.append(Unit(span[0], span[1], kind, about))

    def code(self, i: int, about: str) -> None:
        self.add(self.starts[i], self.starts[i] + len(self.lines[i]), "code", about)

    def begin(self, start: int, i: int, indent: int, kind: str, about: str, lazy: bool = False) -> None:
        self.flush()
        self.para = _Paragraph(start, self.starts[i] + len(self.lines[i]), indent, kind, about, lazy)

    def flush(self) -> None:
        para, self.para = self.para, None
        if para is None:
            return
        if para.kind == "text":
            for a, b in sentences(self.text, para.start, para.end):
                self.add(a, b, "text", para.about)
        else:
            self.add(para.start, para.end, para.kind, para.about)

    # -- the pass ------------------------------------------------------------------

    def read(self) -> list[Unit]:
        lines, n = self.lines, len(self.lines)
        fence: str | None = None  # the about of the fenced block being read
        doctest: str | None = None  # the about of the doctest whose output lines are being read
        block: tuple[int, str, str] | None = None  # AsciiDoc: (closing line, kind, about) of a code or quiet block
        i = 0
        while i < n:
            line = lines[i]
            start = self.starts[i]
            if block is not None:
                if i == block[0]:
                    block = None
                    self.state = "closed" if self.items else None
                elif block[1] == "code" and line.strip():
                    self.code(i, block[2])
                i += 1
                continue
            if fence is not None:
                if _FENCE.match(line):
                    fence = None
                else:
                    self.code(i, fence)
                i += 1
                continue
            if not line.strip():
                para = self.para
                self.flush()
                if para is not None and not self.asciidoc and self.text[para.start:para.end].rstrip().endswith("::"):
                    self.literal_after = para.indent  # a literal block follows, indented under it
                doctest = None
                if self.state == "desc":
                    self.state = "closed"
                i += 1
                continue
            indent = len(line) - len(line.lstrip())
            if not self.asciidoc:
                while self.frames and self.frames[-1].indent >= indent:
                    self.frames.pop()
                if self.frames and self.frames[-1].kind in ("code", "quiet"):
                    if self.frames[-1].kind == "code":
                        self.flush()
                        self.code(i, self.about(start))
                    i += 1
                    continue
            if i in self.titles:
                self.flush()
                title = self.titles[i]
                self.frames.clear()
                self.items.clear()
                self.closers.clear()
                self.state = self.md_term = self.literal_after = doctest = None
                self.add(self.starts[title.line], self.starts[title.line] + len(lines[title.line]), "heading",
                         self.parents[i])
                i = title.last + 1
                continue
            if _FENCE.match(line):
                self.flush()
                fence = self.about(start)
                i += 1
                continue
            if line.lstrip().startswith(">>>") or doctest is not None:
                self.flush()
                doctest = doctest if doctest is not None else self.about(start)
                self.code(i, doctest)
                i += 1
                continue
            if self.literal_after is not None:
                literal, self.literal_after = self.literal_after, None
                if self.para is None and indent > literal:
                    self.frames.append(_Frame(literal, "code"))
                    self.code(i, self.about(start))
                    i += 1
                    continue
            i = self.asciidoc_line(i, line, indent) if self.asciidoc else self.line(i, line, indent)
            if isinstance(i, tuple):  # an AsciiDoc code or quiet block opened
                i, block = i
        self.flush()
        return self.units

    def line(self, i: int, line: str, indent: int) -> int:
        """Read the line ``i`` of a reStructuredText, Markdown or plain text
        (not blank, in no code): the index of the next line to read."""
        start, lines, para = self.starts[i], self.lines, self.para
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (table := self.table(i, line, indent)) is not None:
            return table
        if _UNDERLINE.fullmatch(line):
            self.flush()  # an overline or a transition
            return i + 1
        if line.lstrip().startswith(".. ") and not self.markdown:
            return self.directive(i, line, indent)
        if self.markdown and self.md_term is not None and para is None and _MD_DEFINITION.match(line):
            self.begin(start + _MD_DEFINITION.match(line).end(), i, 1, "definition", self.md_term, lazy=True)
            return i + 1
        if self.markdown and para is None and nxt[:1] == ":" and _MD_DEFINITION.match(nxt) and not _ITEM.match(line):
            self.md_term = clean_heading(line)  # a term over ": its description"
            return i + 1
        if para is None:
            self.md_term = None
        if self.indented_lists and para is not None and para.kind == "definition" and indent < para.indent:
            self.flush()  # a description ends where a line less indented starts: the next item's
            para = None
        if self.indented_lists and para is None:
            if (field_list := _FIELD.match(line)) is not None:
                self.flush()
                self.frames.append(_Frame(indent, "term", clean_heading(field_list.group(1))))
                if field_list.end() < len(line):
                    self.begin(start + field_list.end(), i, indent + 1, "definition", self.frames[-1].about)
                return i + 1
            if (option := _option(line, indent)) is not None and (option[1] is not None or _under(nxt, indent)):
                self.flush()
                self.frames.append(_Frame(indent, "term", clean_heading(option[0])))
                if option[1] is not None:
                    self.begin(start + option[1], i, indent + 1, "definition", self.frames[-1].about)
                return i + 1
            if (_under(nxt, indent) and not _ITEM.match(line) and not line.rstrip().endswith("::")
                    and not _ROW.fullmatch(line) and not _GRID.fullmatch(line)):
                self.flush()  # a definition list's term over its indented description
                self.frames.append(_Frame(indent, "term", clean_heading(line)))
                return i + 1
        item = _ITEM.match(line) is not None
        if para is not None and not item and (indent >= para.indent or para.lazy):
            para.end = start + len(line)
            return i + 1
        kind = "item" if item else "definition" if self.defining() else "text"
        self.begin(start, i, indent + item, kind, self.about(start), lazy=item and self.markdown)
        return i + 1

    def table(self, i: int, line: str, indent: int) -> int | None:
        """The next line after a table or a row that starts at line ``i``, None if none does."""
        lines, start = self.lines, self.starts[i]
        if _ROW.fullmatch(line):
            self.flush()  # "City: Oslo; Pop: 700k" says its headers itself
            self.add(start, start + len(line), "row", self.about(start))
            return i + 1
        if "|" in line and i + 1 < len(lines) and _pipe_delimiter(lines[i + 1]) and not self.asciidoc:
            self.flush()
            about = " | ".join(c for c in (clean_heading(c) for c in _pipe_cells(line)) if c) or self.about(start)
            k = i + 2
            while k < len(lines) and "|" in lines[k] and lines[k].strip():
                self.add(self.starts[k], self.starts[k] + len(lines[k]), "row", about)
                k += 1
            return k
        if _GRID_BORDER.fullmatch(line):
            return self.grid(i, indent)
        if _SIMPLE_BORDER.fullmatch(line) and not self.markdown:
            return self.simple(i, indent)
        if _GRID.fullmatch(line):
            self.flush()
            self.add(start, start + len(line), "row", self.about(start))
            return i + 1
        return None

    def grid(self, i: int, indent: int) -> int:
        """A grid table from its top border at line ``i``: each body row, over its lines, one unit."""
        self.flush()
        lines, about = self.lines, self.about(self.starts[i])
        end = i + 1
        while end < len(lines) and lines[end][indent:indent + 1] in ("+", "|") and lines[end].strip():
            end += 1
        rows: list[list[int]] = []
        header: list[list[int]] = []
        for k in range(i + 1, end):
            if _GRID_BORDER.fullmatch(lines[k]):
                if "=" in lines[k] and not header:
                    header, rows = rows, []
                rows.append([])
            else:
                if not rows:
                    rows.append([])
                rows[-1].append(k)
        if header:
            about = _header([lines[k].strip().strip("|").split("|") for row in header for k in row]) or about
        for row in rows:
            if row:
                self.add(self.starts[row[0]], self.starts[row[-1]] + len(lines[row[-1]]), "row", about)
        return end

    def simple(self, i: int, indent: int) -> int:
        """A simple table from its top border at line ``i``: each body row one unit (a line whose first
        column is blank goes on with the row above), about its header."""
        self.flush()
        lines = self.lines
        columns = [m.start() for m in re.finditer(r"=+", lines[i])]
        about = self.about(self.starts[i])
        borders: list[int] = []
        k = i + 1
        while k < min(len(lines), i + MAX_TABLE_LINES):
            if _SIMPLE_BORDER.fullmatch(lines[k]):
                borders.append(k)
                if len(borders) == 2 or k + 1 >= len(lines) or not lines[k + 1].strip():
                    break
            elif lines[k].strip() and len(lines[k]) - len(lines[k].lstrip()) < indent:
                break
            k += 1
        if not borders:
            return i + 1  # a border alone: no words
        end, body_from = borders[-1], i + 1
        if len(borders) == 2:
            head = [lines[h] for h in range(i + 1, borders[0]) if not set(lines[h].strip()) <= set("- ")]
            about = _header([[ln[a:b] for a, b in zip(columns, columns[1:] + [None])] for ln in head]) or about
            body_from = borders[0] + 1
        row: list[int] = []
        for k in range(body_from, end + 1):
            line = lines[k] if k < end else ""
            rule = set(line.strip()) <= set("-= ")  # a blank line, or a column span's underline
            if row and (rule or line[:columns[1]].strip()):
                self.add(self.starts[row[0]], self.starts[row[-1]] + len(lines[row[-1]]), "row", about)
                row = []
            if not rule:
                row.append(k)
        return end + 1

    def directive(self, i: int, line: str, indent: int) -> int:
        """An explicit markup block at line ``i`` (a directive, a footnote, a comment or a target)."""
        self.flush()
        lines, start = self.lines, self.starts[i]
        directive = _DIRECTIVE.fullmatch(line)
        if directive is None:
            footnote = _FOOTNOTE.match(line)
            if footnote is not None:
                self.begin(start + footnote.end(), i, indent + 1, "text", self.about(start))
            elif not _TARGET.match(line):
                self.frames.append(_Frame(indent, "quiet"))  # a comment, with the lines indented under it
            return i + 1
        name, argument = directive.group(2), directive.group(3)
        last = i
        while argument and last + 1 < len(lines):  # the argument goes on over the lines indented under it
            after = lines[last + 1]
            if not after.strip() or len(after) - len(after.lstrip()) <= indent or _OPTION.fullmatch(after):
                break
            last += 1
        end = self.starts[last] + len(lines[last])
        about = self.about(start)
        bare = name.split(":")[-1]
        if argument and _API.fullmatch(name):
            self.add(start + indent, end, "signature", about)
            signature = self.text[start + directive.start(3):end][:MAX_HEADING_CHARS]
            self.frames.append(_Frame(indent, "api", " ".join(signature.replace("\\\n", " ").split())))
        elif argument and bare not in _QUIET_DIRECTIVES and bare not in _CODE_DIRECTIVES:
            self.add(start + indent, end, "text", about)  # ".. versionadded:: 3.2", ".. note:: Beware."
        i = last + 1
        while i < len(lines) and _OPTION.fullmatch(lines[i]) and len(lines[i]) - len(lines[i].lstrip()) > indent:
            i += 1
        if bare in _CODE_DIRECTIVES:
            self.frames.append(_Frame(indent, "code"))
        elif bare in _QUIET_BODIES:
            self.frames.append(_Frame(indent, "quiet"))
        return i

    # -- AsciiDoc -------------------------------------------------------------------

    def asciidoc_line(self, i: int, line: str, indent: int) -> int | tuple[int, tuple[int, str, str]]:
        """Read the line ``i`` of an AsciiDoc text (not blank, in no block):
        the index of the next line, with the block it opens if it opens one."""
        lines, start, para = self.lines, self.starts[i], self.para
        body = line.strip()
        if body.startswith("//") and not body.startswith("////"):
            return i + 1  # a comment
        if (_ADOC_PREPROCESSOR.fullmatch(line) or (indent == 0 and _ADOC_ATTRIBUTE.fullmatch(line))
                or (indent == 0 and _ADOC_BLOCK_ATTRIBUTE.fullmatch(body))):
            self.flush()  # "ifdef::git-diff[]", ":attr: 1", "[verse]": markup, in the list or not
            return i + 1
        if body == "+":
            self.flush()
            if self.items:
                self.state = "attach"
            return i + 1
        if self.closers and i == self.closers[-1][0]:
            self.flush()
            _, attached = self.closers.pop()
            if attached:
                while self.items and self.items[-1].marker:
                    self.items.pop()
                if self.items:
                    self.items.pop()  # the block's barrier
            self.state = "closed" if self.items else None
            return i + 1
        close = self.delimiters.closing(i) if self.delimiters is not None else None
        if close is not None:
            self.flush()
            self.enter()
            about = self.about(start)
            kind = _adoc_block(body)
            if kind in ("code", "quiet"):
                return i + 1, (close, kind, about)
            if kind == "table":
                self.adoc_table(i, close, about)
                return close + 1
            # An open, example, sidebar or quote block: its blocks are the item's it is attached to, and
            # the items it holds end with it.
            attached = bool(self.items)
            if attached:
                self.items.append(_Item("", [self.items[-1].about]))
                self.state = "attach"
            self.closers.append((close, attached))
            return i + 1
        if (term := _adoc_term(line)) is not None:
            self.flush()
            text, marker, inline = term
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
                self.items.append(_Item(marker, [text]))
            self.state = "terms"
            if inline is not None:
                self.begin(start + inline, i, indent + 1, "definition", self.items[-1].about, lazy=True)
                self.state = "desc"
            return i + 1
        if para is None and indent == 0 and _ADOC_BLOCK_TITLE.match(line):
            self.enter()
            self.add(start, start + len(line), "heading", self.about(start))  # ".Example": the next block's title
            return i + 1
        if _UNDERLINE.fullmatch(line):
            self.flush()
            return i + 1
        if (table := self.table(i, line, indent)) is not None:
            return table
        item = _ITEM.match(line) is not None
        if para is not None and not item:
            para.end = start + len(line)  # AsciiDoc's paragraphs and items go on over any line that starts no block
            return i + 1
        self.enter(indent)
        if not item and indent > 0 and not self.items:
            self.flush()  # a literal paragraph: code up to a blank line
            k = i
            about = self.about(start)
            while k < len(lines) and lines[k].strip():
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
            about = _header([lines[rows[0]].strip().strip("|").split("|")]) or about
            rows = rows[1:]
        for k in rows:
            self.add(self.starts[k], self.starts[k] + len(lines[k]), "row", about)


def _adoc_term(line: str) -> tuple[str, str, int | None] | None:
    """``(term, marker, where its inline description starts or None)`` of
    an AsciiDoc labelled list item's line, else None.

    ``_adoc_term("--include-untracked::") -> ("--include-untracked", "::", None)``;
    ``_adoc_term("'%n':: newline") -> ("'%n'", "::", 6)``
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


def _adoc_block(delimiter: str) -> str:
    """What an AsciiDoc block opened by ``delimiter`` holds: "code" (a
    listing or literal block), "quiet" (a comment or passthrough block),
    "table", or "blocks" (an open, example, sidebar or quote block)."""
    mark = delimiter.strip()[:4]
    return {"----": "code", "....": "code", "////": "quiet", "++++": "quiet", "|===": "table"}.get(mark, "blocks")


def _adoc_markup(line: str) -> bool:
    """Whether ``line`` is AsciiDoc markup that stands before a block: a
    block attribute or anchor, a list continuation, a block title, a
    comment or a preprocessor line."""
    body = line.strip()
    return bool(body == "+" or _ADOC_BLOCK_ATTRIBUTE.fullmatch(body) or _ADOC_PREPROCESSOR.fullmatch(body)
                or body.startswith("//") or (line[:1] == "." and _ADOC_BLOCK_TITLE.match(line)))


def _under(line: str, indent: int) -> bool:
    """Whether ``line`` is not blank and indented more than ``indent``."""
    return bool(line.strip()) and len(line) - len(line.lstrip()) > indent


def _option(line: str, indent: int) -> tuple[str, int | None] | None:
    """``(options, where the description starts on the line or None)`` of
    an option list's item (``-f FILE, --file=FILE  Read it.``), else None."""
    body = line[indent:].rstrip()
    if not body.startswith("-"):
        return None
    cut = re.search(r" {2,}|\t", body)
    left = body[:cut.start()] if cut else body
    if not _OPTIONS.fullmatch(left):
        return None
    return left, (indent + cut.end() if cut else None)


def _pipe_cells(line: str) -> list[str]:
    return line.strip().removeprefix("|").removesuffix("|").split("|")


def _pipe_delimiter(line: str) -> bool:
    """Whether ``line`` is a Markdown table's delimiter row (``|---|:--:|``)."""
    if "-" not in line or not line.strip():
        return False
    cells = _pipe_cells(line)
    return ("|" in line or len(cells) > 1) and all(_PIPE_CELL.fullmatch(c.strip()) for c in cells)


def _header(rows: list[list[str]]) -> str:
    """A table's header from its lines' cells: each column's lines joined,
    the columns joined " | "."""
    columns: list[list[str]] = []
    for cells in rows:
        for k, cell in enumerate(cells):
            if k >= len(columns):
                columns.append([])
            if cell.strip():
                columns[k].append(cell.strip())
    return " | ".join(c for c in (clean_heading(" ".join(col)) for col in columns) if c)
