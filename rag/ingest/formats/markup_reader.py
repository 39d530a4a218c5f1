"""The units of a reStructuredText, Markdown or plain text, read in one
pass of its lines (see :func:`.markup.read_markup` for what they are):
paragraphs and their sentences, list items, definition, field and option
lists (by indentation), API directives and their bodies, code (fences,
doctests, literal blocks, code directives) and tables (pipe, grid, simple,
and ``header: value; ...`` rows). AsciiDoc's own rules are
``asciidoc_reader``'s, on top of this one's.

Does not: find the titles (``markup_titles``), or read a line twice: a
block's end is found by looking ahead at most over the block itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from .document import Unit
from .markup_syntax import FENCE, ITEM, MAX_HEADING_CHARS, UNDERLINE, clean_heading, table_header
from .markup_titles import Title
from .units import Headings, sentences, stripped

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


class MarkupReader:
    """One pass over the lines of a text: see :func:`.markup.read_markup`."""

    def __init__(self, text: str, lines: list[str], starts: list[int], titles: list[Title],
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
        self.units: list[Unit] = []
        self.frames: list[_Frame] = []
        self.para: _Paragraph | None = None
        self.literal_after: int | None = None  # the indent of a paragraph that ended in "::"
        self.md_term: str | None = None  # Markdown: the term whose ": description"s are being read
        self.fence: str | None = None  # the about of the fenced block being read
        self.doctest: str | None = None  # the about of the doctest whose output lines are being read

    # -- what encloses a line --------------------------------------------------

    def heading(self, offset: int) -> str:
        return self.outline.above(offset)

    def about(self, offset: int) -> str:
        """What a unit starting at ``offset`` inside the current frames is about."""
        for frame in reversed(self.frames):
            if frame.about is not None:
                return frame.about
        return self.heading(offset)

    def defining(self) -> bool:
        """Whether prose here is a definition's description."""
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
        """The text's units, in order."""
        i = 0
        while i < len(self.lines):
            i = self.read_line(i)
        self.flush()
        return self.units

    def read_line(self, i: int) -> int:
        """Read the line ``i`` (and any it takes along): the index of the next line to read."""
        line, start = self.lines[i], self.starts[i]
        if self.fence is not None:
            if FENCE.match(line):
                self.fence = None
            else:
                self.code(i, self.fence)
            return i + 1
        if not line.strip():
            self.blank_line()
            return i + 1
        indent = len(line) - len(line.lstrip())
        if not self.asciidoc:
            while self.frames and self.frames[-1].indent >= indent:
                self.frames.pop()
            if self.frames and self.frames[-1].kind in ("code", "quiet"):
                if self.frames[-1].kind == "code":
                    self.flush()
                    self.code(i, self.about(start))
                return i + 1
        if i in self.titles:
            return self.read_title(i)
        if FENCE.match(line):
            self.flush()
            self.fence = self.about(start)
            return i + 1
        if line.lstrip().startswith(">>>") or self.doctest is not None:
            self.flush()
            self.doctest = self.doctest if self.doctest is not None else self.about(start)
            self.code(i, self.doctest)
            return i + 1
        if self.literal_after is not None:
            literal, self.literal_after = self.literal_after, None
            if self.para is None and indent > literal:
                self.frames.append(_Frame(literal, "code"))
                self.code(i, self.about(start))
                return i + 1
        return self.line(i, line, indent)

    def blank_line(self) -> None:
        """A blank line: the paragraph ends (and, after a "::", a literal block may follow), and a doctest."""
        para = self.para
        self.flush()
        if para is not None and not self.asciidoc and self.text[para.start:para.end].rstrip().endswith("::"):
            self.literal_after = para.indent  # a literal block follows, indented under it
        self.doctest = None

    def read_title(self, i: int) -> int:
        """The title whose first line is ``i``: a "heading" unit, about the heading it lies under;
        what was open before it ends. The index of the line after it."""
        self.flush()
        title = self.titles[i]
        self.frames.clear()
        self.md_term = self.literal_after = self.doctest = None
        self.add(self.starts[title.line], self.starts[title.line] + len(self.lines[title.line]), "heading",
                 self.parents[i])
        return title.last + 1

    def line(self, i: int, line: str, indent: int) -> int:
        """Read the line ``i`` of a reStructuredText, Markdown or plain text
        (not blank, in no code): the index of the next line to read."""
        start, lines, para = self.starts[i], self.lines, self.para
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (table := self.table(i, line, indent)) is not None:
            return table
        if UNDERLINE.fullmatch(line):
            self.flush()  # an overline or a transition
            return i + 1
        if line.lstrip().startswith(".. ") and not self.markdown:
            return self.directive(i, line, indent)
        if self.markdown and self.md_term is not None and para is None and _MD_DEFINITION.match(line):
            self.begin(start + _MD_DEFINITION.match(line).end(), i, 1, "definition", self.md_term, lazy=True)
            return i + 1
        if self.markdown and para is None and nxt[:1] == ":" and _MD_DEFINITION.match(nxt) and not ITEM.match(line):
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
            if (_under(nxt, indent) and not ITEM.match(line) and not line.rstrip().endswith("::")
                    and not _ROW.fullmatch(line) and not _GRID.fullmatch(line)):
                self.flush()  # a definition list's term over its indented description
                self.frames.append(_Frame(indent, "term", clean_heading(line)))
                return i + 1
        item = ITEM.match(line) is not None
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
            about = table_header([lines[k].strip().strip("|").split("|") for row in header for k in row]) or about
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
            about = table_header([[ln[a:b] for a, b in zip(columns, columns[1:] + [None])] for ln in head]) or about
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
