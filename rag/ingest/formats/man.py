"""Man pages: roff written with the ``man`` macros (as the Linux man-pages
project and most Debian pages write it), gzipped or not, read into plain
text with the page's outline and its own units.

What is read: ``.TH`` (the title, "tcp(7) — TCP protocol" with the NAME
line's description), ``.SH``/``.SS`` headings (levels 1 and 2), paragraphs
(``.PP``/``.LP``/``.P``/``.HP``, ``.sp``, blank lines), tagged paragraphs
(``.TP``/``.TQ``, ``.IP`` with a tag: the tag is a definition's term, the
paragraphs after it up to the next ``.TP``/``.IP``/``.PP``/``.SH``/``.SS`` at
the same ``.RS`` depth its description; ``.IP`` with a bullet or a number is a
list item), ``.RS``/``.RE`` nesting, the font macros (alternating fonts joined
without spaces, as roff does), ``.nf``/``.fi`` and ``.EX``/``.EE`` (code),
``.UR``/``.UE`` and ``.MT``/``.ME`` links, ``.SY``/``.OP``/``.YS``, ``.MR``,
tbl tables (``.TS``/``.TE``, ``T{``/``T}`` blocks, a header row found by the
rule under it or its bold format), inline escapes (fonts, sizes, special
characters, strings, ``\\c`` continuations; unknown ones dropped),
comments, ``.if``/``.ie``/``.el`` (read as nroff would: ``n`` true, ``t``
false, ``\\n(.g`` set), ``.ds``/``.as`` strings, ``.nr`` registers and the
page's own ``.de`` macros (rst2man's ``.INDENT``, pod2man's ``.Vb``),
expanded to a bounded depth and count. mdoc pages (``.Dd``/``.Dt``/``.Sh``)
are read plainly: headings, paragraphs, lists and displays, the macro names
dropped and their words kept.

Units: headings; each prose sentence ("text", about the nearest heading); each
paragraph of a definition's description, whole ("definition", about its term,
several ``.TQ`` terms joined with ", "); each paragraph of a list item
("item", about what the list is in); each code line ("code"); each table row
("row": the header row as "A | B", the others as "A: x; B: y"). A term with
no description is a "definition" unit about itself.

A gzipped page is inflated at most to the text limit (``max_chars`` bytes),
so a gzip bomb is refused (TextOverLimit) without being inflated; the text
is checked against the limit as it is written.

Does not: lay the page out (no line filling, hyphenation or indentation),
run ``.so`` includes (a page that is only a ``.so`` reads "See name(N)."),
read pic/eqn/refer input, or decode text that is not UTF-8.

Where it is done: ``roff`` is the engine (lines, requests, strings,
registers, the page's macros, conditionals), with ``roff_escapes`` and
``roff_numbers``; ``tbl`` reads tables, ``mdoc`` the mdoc macros, and
``man_text`` writes the text and its units; this module reads the ``man``
macros and says what each means.
"""

from __future__ import annotations

import re
import zlib

from ...errors import DocumentError
from .document import LoadedDocument, TextOverLimit, text_limit
from .man_text import PageText
from .mdoc import MDOC_MACROS, Mdoc
from .roff import ROFF_REQUESTS, Cursor, Roff, continued, logical_lines, macro_args, squash, strip_comment
from .roff_numbers import evaluate
from .tbl import table_rows
from .text import decode_text

MAN_SUFFIXES = frozenset({".man"})  # what format_suffix names every man page by (and "x.man" files)
# A man page's name: section 1-8, an optional suffix of letters ("5ssl"), gzipped or not.
MAN_NAME = re.compile(r"\.[1-8][a-z]*(?:\.gz)?$", re.IGNORECASE)
GZIP_MAGIC = b"\x1f\x8b"

# The ``man`` strings a page may use without defining them, as roff source.
_MAN_STRINGS = {"lq": "\\(lq", "rq": "\\(rq", "R": "\\(rg", "Tm": "\\(tm", "aq": "\\(aq", "S": "", "HF": "", "Am": "&",
                "Le": "\\(<=", "Ge": "\\(>=", "Lq": "\\(lq", "Rq": "\\(rq", "Pi": "\\(*p", "Ne": "\\(!=", "Gt": ">",
                "Lt": "<", "Ba": "|", "Ua": "UNIX", "Ux": "UNIX"}


def load_man(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A man page (roff with the ``man`` macros; mdoc read plainly), gzipped
    or not, as text with its title, outline and units. TextOverLimit as
    soon as the inflated page or its text passes ``max_chars`` (default:
    the text limit of ``data``'s size); DocumentError for damaged gzip
    data, binary or non-UTF-8 input.

    ``load_man("ls.1", ".man", b".TH LS 1\\n.SH NAME\\nls \\\\- list files\\n").title -> "LS(1) — list files"``
    """
    limit = text_limit(len(data)) if max_chars is None else max_chars
    if data[:2] == GZIP_MAGIC:
        data = gunzip(source, data, limit)
    return _ManReader(limit).read(decode_text(source, data))


def gunzip(source: str, data: bytes, limit: int) -> bytes:
    """``data`` (one gzip member or several) inflated, never past ``limit``
    bytes: TextOverLimit as soon as it would be; DocumentError for damaged
    or truncated data. Anything after the last member is ignored, as gzip does."""
    out = bytearray()
    rest = data
    try:
        while rest[:2] == GZIP_MAGIC:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = rest
            while not inflater.eof:
                piece = inflater.decompress(pending, limit - len(out) + 1)
                out += piece
                if len(out) > limit:
                    raise TextOverLimit(limit)
                pending = inflater.unconsumed_tail
                if not piece and not pending:
                    break
            if not inflater.eof:
                raise DocumentError(source, "its gzip data is cut short (a truncated file); unpack it to check, "
                                            "or download it again")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise DocumentError(source, f"damaged gzip data ({exc}); unpack it to check, or download it again") from None
    return bytes(out)


_MARKER = re.compile(r"[•*+\-o·–—■□◦‣∙]|\(?\d{1,3}[.)]?|\(?[a-zA-Z][.)]|\([a-zA-Z]\)|\[\d{1,3}\]|[ivxIVX]{1,5}[.)]")
_BULLETS = frozenset("•*+-o·■□◦‣∙")


def _marker(tag: str) -> str | None:
    """The list marker a tag is ("•" for any bullet, "2." as written), None if it is a term."""
    tag = tag.strip()
    if not _MARKER.fullmatch(tag):
        return None
    return "•" if tag in _BULLETS else tag


class _ManReader:
    """Reads a page's lines: the engine (``roff``) keeps strings, registers
    and macros and reads escapes; the ``man`` macros here (and the mdoc ones,
    ``mdoc``) say what to write into the page's text (``man_text``)."""

    def __init__(self, max_chars: int) -> None:
        self.roff = Roff(max_chars, _MAN_STRINGS)
        self.render = self.roff.render
        self.page = PageText(max_chars)
        self.mdoc = Mdoc(self.page, self.render)
        self.links: list[tuple[str, int]] = []  # open .UR/.MT links: (address, where the paragraph stood)
        self.so_target: str | None = None

    # -- reading ----------------------------------------------------------

    def read(self, text: str) -> LoadedDocument:
        """The page ``text`` read whole (a page that is only a ``.so`` reads "See name(N).")."""
        self._run(Cursor(logical_lines(text)), 0)
        self.page.end_capture()
        self.page.reset()
        if not self.page.length and self.so_target:
            base = self.so_target.rsplit("/", 1)[-1]
            m = re.fullmatch(r"(.+)\.([1-9]\w*?)(?:\.gz)?", base)
            self.page.paragraph([f"See {m.group(1)}({m.group(2)})." if m else f"See {base}."], "text", "")
        return self.page.document()

    def _run(self, cursor: Cursor, depth: int) -> None:
        while (line := cursor.next()) is not None:
            self._line(line, cursor, depth)

    def _line(self, line: str, cursor: Cursor, depth: int) -> None:
        if line[:1] in (".", "'"):
            self._control(line[1:], cursor, depth)
        else:
            self._text_line(line)

    def _text_line(self, line: str) -> None:
        page = self.page
        if not line.strip():
            page.blank()
            return
        line, more = continued(strip_comment(line))
        if line[:1] in (" ", "\t") and not page.nf:
            page.line_break()
        text = self.render(line)
        if not text.strip() and re.fullmatch(r"(?:\\[{}]|\s)*", line):
            return  # only the end of a conditional block
        if text.strip() or (page.nf and not page.capture):
            page.add(text, more)
        elif more:
            page.nospace = True

    # -- control lines ------------------------------------------------------

    def _control(self, body: str, cursor: Cursor, depth: int) -> None:
        body = strip_comment(body).lstrip(" \t")
        if not body or body[0] == "\\":
            return
        m = re.match(r"\S+", body)
        name, rest = m.group(), body[m.end():]
        if name in ("if", "ie", "el", "while"):
            rest = self.roff.conditional(name, rest, cursor)
            if rest.strip():
                self._line(rest, cursor, depth)
            return
        if name in ("de", "de1", "am", "am1", "ig", "dei", "ami", "dei1", "ami1"):
            self.roff.define(name, rest, cursor)
            return
        if name == "TS":
            self._table(cursor)
            return
        if name in ("ds", "ds1", "as", "as1"):
            self.roff.define_string(name, rest)
            return
        rest, more = continued(rest)
        args = macro_args(rest)
        handler = _MACROS.get(name)
        if handler is not None:
            handler(self, args, more)
        elif self.roff.can_expand(name, depth):
            self._run(Cursor(self.roff.expansion(name, args)), depth + 1)
        elif name in MDOC_MACROS:
            self.mdoc.macro(name, args)
        elif name == "nop":
            self._text_line(rest.lstrip())
        elif name == "do" and rest.strip():
            self._control(rest, cursor, depth)
        elif name in ROFF_REQUESTS:
            ROFF_REQUESTS[name](self.roff, args)
        elif name in _REQUESTS:
            _REQUESTS[name](self, args, rest)
        elif not name[:1].islower() and any(any(c.isalpha() for c in self.render(a)) for a in args):
            self.page.add(" ".join(self.render(a) for a in args), more)  # an unknown macro: its words kept

    # -- tables ------------------------------------------------------------------------

    def _table(self, cursor: Cursor) -> None:
        """A tbl table, ``.TS`` to ``.TE``: a row a line, kept beside its header (see ``tbl``)."""
        self.page.settle()
        rows = table_rows(cursor, self.render, self._cell_line, self.page.length, self.page.max_chars)
        if rows:
            self.page.rows(rows)

    def _cell_line(self, line: str) -> str:
        """A line of a ``T{`` block: its text, a font macro's words, nothing for other requests."""
        if line[:1] not in (".", "'"):
            return self.render(continued(line)[0])
        body = strip_comment(line[1:]).strip()
        m = re.match(r"(\S+)\s*(.*)", body)
        if not m:
            return ""
        handler = _MACROS.get(m.group(1))
        args = macro_args(m.group(2))
        if handler is _ManReader._font:
            return " ".join(self.render(a) for a in args)
        if handler is _ManReader._alternating:
            return "".join(self.render(a) for a in args)
        return ""

    # -- man macros ------------------------------------------------------------------

    def _th(self, args: list[str], more: bool) -> None:
        page = self.page
        page.end_capture()
        page.reset()
        page.nf = False
        if args:
            name = squash(self.render(args[0]))
            section = squash(self.render(args[1])) if len(args) > 1 else ""
            page.title = f"{name}({section})" if section else name

    def _sh(self, args: list[str], more: bool, level: int = 1) -> None:
        self.page.section(level, squash(" ".join(self.render(a) for a in args)))

    def _ss(self, args: list[str], more: bool) -> None:
        self._sh(args, more, 2)

    def _pp(self, args: list[str], more: bool) -> None:
        self.page.start_paragraph()

    def _tp(self, args: list[str], more: bool) -> None:
        page = self.page
        page.end_capture()
        item = page.new_item("definition")
        page.set_item(item)
        page.capture_term(item)

    def _tq(self, args: list[str], more: bool) -> None:
        page = self.page
        page.end_capture()
        item = page.frames[-1]
        if item is None or item.kind != "definition":
            self._tp(args, more)
            return
        page.flush()
        page.capture_term(item)

    def _ip(self, args: list[str], more: bool) -> None:
        page = self.page
        page.end_capture()
        tag = squash(self.render(args[0])) if args else ""
        if not tag:
            page.flush()  # a paragraph more of the item at this depth, if any
            return
        marker = _marker(tag)
        if marker is not None:
            page.set_item(page.new_item("item", marker))
            return
        item = page.new_item("definition")
        page.set_item(item)
        page.term(item, tag)

    def _rs(self, args: list[str], more: bool) -> None:
        self.page.indent()

    def _re(self, args: list[str], more: bool) -> None:
        self.page.settle()
        self.page.outdent(max(1, int(evaluate(args[0]))) if args else None)

    def _font(self, args: list[str], more: bool) -> None:
        if args:
            self.page.add(" ".join(self.render(a) for a in args), more)

    def _alternating(self, args: list[str], more: bool) -> None:
        if args:
            self.page.add("".join(self.render(a) for a in args), more)

    def _nf(self, args: list[str], more: bool) -> None:
        self.page.set_no_fill(True)

    def _fi(self, args: list[str], more: bool) -> None:
        self.page.set_no_fill(False)

    def _br(self, args: list[str], more: bool) -> None:
        if self.page.capture is None:
            self.page.line_break()

    def _sp(self, args: list[str], more: bool) -> None:
        self.page.blank()

    def _ur(self, args: list[str], more: bool) -> None:
        self.links.append((self.render(args[0]) if args else "", self.page.para_len))

    def _ue(self, args: list[str], more: bool) -> None:
        if not self.links:
            return
        url, at = self.links.pop()
        trailing = "".join(self.render(a) for a in args)
        if url:
            self.page.add(f"<{url}>" if self.page.para_len > at else url, bool(trailing))
        if trailing:
            self.page.add(trailing, more)

    def _sy(self, args: list[str], more: bool) -> None:
        self.page.flush()
        if args:
            self.page.add(self.render(args[0]), more)

    def _op(self, args: list[str], more: bool) -> None:
        if args:
            self.page.add("[" + " ".join(self.render(a) for a in args) + "]", more)

    def _mr(self, args: list[str], more: bool) -> None:
        if args:
            section = f"({self.render(args[1])})" if len(args) > 1 else ""
            self.page.add(self.render(args[0]) + section + "".join(self.render(a) for a in args[2:]), more)

    def _ignore(self, args: list[str], more: bool) -> None:
        pass

    # -- requests that write (the engine's own are ROFF_REQUESTS) ---------------------

    def _so(self, args: list[str], rest: str) -> None:
        if args:
            self.so_target = args[0]

    def _tl(self, args: list[str], rest: str) -> None:
        rest = rest.strip()
        if rest:
            parts = [squash(self.render(p)) for p in rest[1:].split(rest[0])]
            self.page.line_break()
            self.page.add(" ".join(p for p in parts if p))
            self.page.line_break()

    def _request_break(self, args: list[str], rest: str) -> None:
        self._br(args, False)


_MACROS = {
    "TH": _ManReader._th, "SH": _ManReader._sh, "SS": _ManReader._ss, "PP": _ManReader._pp, "LP": _ManReader._pp,
    "P": _ManReader._pp, "HP": _ManReader._pp, "TP": _ManReader._tp, "TQ": _ManReader._tq, "IP": _ManReader._ip,
    "RS": _ManReader._rs, "RE": _ManReader._re, "B": _ManReader._font, "I": _ManReader._font, "SM": _ManReader._font,
    "SB": _ManReader._font, "BR": _ManReader._alternating, "BI": _ManReader._alternating,
    "IR": _ManReader._alternating, "RB": _ManReader._alternating, "RI": _ManReader._alternating,
    "IB": _ManReader._alternating, "nf": _ManReader._nf, "fi": _ManReader._fi, "EX": _ManReader._nf,
    "EE": _ManReader._fi, "Vb": _ManReader._nf, "Ve": _ManReader._fi, "br": _ManReader._br, "sp": _ManReader._sp,
    "Sp": _ManReader._sp, "UR": _ManReader._ur, "UE": _ManReader._ue, "MT": _ManReader._ur, "ME": _ManReader._ue,
    "SY": _ManReader._sy, "OP": _ManReader._op, "YS": _ManReader._fi, "MR": _ManReader._mr, "PD": _ManReader._ignore,
    "DT": _ManReader._ignore, "UC": _ManReader._ignore, "AT": _ManReader._ignore, "IX": _ManReader._ignore,
    "UN": _ManReader._ignore, "TE": _ManReader._ignore, "bp": _ManReader._br, "ce": _ManReader._ignore,
}
# Requests that matter when read as text (with the engine's, ROFF_REQUESTS); every other lower-case request is ignored.
_REQUESTS = {
    "so": _ManReader._so, "tl": _ManReader._tl, "in": _ManReader._request_break, "ti": _ManReader._request_break,
}
