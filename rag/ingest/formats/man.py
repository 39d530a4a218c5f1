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
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from dataclasses import dataclass, field

from ...errors import DocumentError
from .document import CONTEXT_SEPARATOR, LoadedDocument, TextOverLimit, Unit, check_text, text_limit
from .tables import header_text
from .text import decode_text
from .units import sentences, stripped

MAN_SUFFIXES = frozenset({".man"})  # what format_suffix names every man page by (and "x.man" files)
# A man page's name: section 1-8, an optional suffix of letters ("5ssl"), gzipped or not.
MAN_NAME = re.compile(r"\.[1-8][a-z]*(?:\.gz)?$", re.IGNORECASE)
GZIP_MAGIC = b"\x1f\x8b"

MAX_MACRO_DEPTH = 16  # a page's own macros calling each other
MAX_MACRO_LINES = 100_000  # lines a page's macros may expand to, in all (the most seen: 23,210, cmake-modules.7)
# The first section's heading when it is surely the NAME line's (else its line must be short to be taken).
_NAME_HEADINGS = frozenset({"NAME", "NOM", "NOMBRE", "NAAM", "NOME", "BEZEICHNUNG", "NAZWA", "ИМЯ", "NAVN", "NIMI"})


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
    return _Reader(limit).read(decode_text(source, data))


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


# -- escapes -------------------------------------------------------------------

_SPECIAL = {
    "em": "—", "en": "–", "hy": "-", "mi": "-", "pl": "+", "eq": "=", "aq": "'", "dq": '"', "lq": "“", "rq": "”",
    "oq": "‘", "cq": "’", "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "Bq": "„", "bq": "‚", "bu": "•", "co": "©",
    "rg": "®", "tm": "™", "de": "°", "+-": "±", "mu": "×", "di": "÷", "<=": "≤", ">=": "≥", "!=": "≠", "==": "≡",
    "~=": "≅", "~~": "≈", "ap": "~", "->": "→", "<-": "←", "<>": "↔", "=>": "⇒", "<=>": "⇔", "ua": "↑", "da": "↓",
    "rA": "⇒", "lA": "⇐", "ti": "~", "ha": "^", "a^": "^", "a~": "~", "rs": "\\", "sl": "/", "ba": "|", "br": "|",
    "or": "|", "bv": "|", "sc": "§", "ps": "¶", "ct": "¢", "Po": "£", "Eu": "€", "eu": "€", "Ye": "¥", "Cs": "¤",
    "dg": "†", "dd": "‡", "lh": "☜", "rh": "☞", "ga": "`", "aa": "´", "ul": "_", "ru": "_", "rn": "‾", "sq": "□",
    "ci": "○", "12": "½", "14": "¼", "34": "¾", "S1": "¹", "S2": "²", "S3": "³", "fm": "′", "sd": "″", "mc": "µ",
    "ss": "ß", "AE": "Æ", "ae": "æ", "OE": "Œ", "oe": "œ", "/o": "ø", "/O": "Ø", "-D": "Ð", "Sd": "ð", "TP": "Þ",
    "Tp": "þ", ".i": "ı", "r!": "¡", "r?": "¿", "OK": "✓", "CR": "↵", "lB": "[", "rB": "]", "lC": "{", "rC": "}",
    "la": "⟨", "ra": "⟩", "at": "@", "sh": "#", "Do": "$", "no": "¬", "tno": "¬", "if": "∞", "pt": "∝", "es": "∅",
    "mo": "∈", "nm": "∉", "sb": "⊂", "sp": "⊃", "ca": "∩", "cu": "∪", "fa": "∀", "te": "∃", "**": "∗", "pd": "∂",
    "gr": "∇", "sr": "√", "is": "∫", "integral": "∫", "sum": "∑", "product": "∏", "AN": "∧", "OR": "∨", "st": "∋",
    "md": "·", "pc": "·", "tmu": "×", "tdi": "÷", "t+-": "±", "vb": "¦", "bb": "¦", "em-dash": "—", "lz": "◊",
    "ts": "ς", "hA": "⇔", "uA": "⇑", "dA": "⇓", "va": "↕", "vA": "⇕", "nb": "⊄", "nc": "⊅", "ib": "⊆", "ip": "⊇",
    "3d": "∴", "tf": "∴", "an": "⎯", "Ah": "ℵ", "Im": "ℑ", "Re": "ℜ", "wp": "℘", "f/": "⁄", "Of": "ª", "Om": "º",
    "char34": '"', "char39": "'", "char92": "\\",
}
_ACCENTS = {"'": "\u0301", "`": "\u0300", "^": "\u0302", ":": "\u0308", '"': "\u0308", "~": "\u0303", ",": "\u0327",
            "o": "\u030a", "v": "\u030c", "a": "\u030a"}
_GREEK = dict(zip("abgdezyhiklmncoprstufxqwABGDEZYHIKLMNCOPRSTUFXQW",
                  "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ"))
# Escapes of one character that stand for text ("" for the ones that print nothing).
_SIMPLE = {"-": "-", "e": "\\", "E": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "|": "", "^": "", "&": "",
           ")": "", ",": "", "/": "", ":": "", "%": "", "a": "", "d": "", "r": "", "u": "", "p": "", "{": "", "}": "",
           "t": "\t", ".": ".", "'": "'", "`": "`", "c": "", "_": "_", "!": "", "z": "", "?": "", "j": "", "@": ""}
_NAMED = frozenset("fFmMkYVgO$")  # \fB, \f(CW, \f[BI], \m[red], \k, \$1: dropped with their names
_DELIMITED = frozenset("AbBDhHlLoRSvwxXZ")  # \w'...', \h'...', \v'...': dropped with their argument
# The ``man`` strings a page may use without defining them, as roff source.
_STRINGS = {"lq": "\\(lq", "rq": "\\(rq", "R": "\\(rg", "Tm": "\\(tm", "aq": "\\(aq", "S": "", "HF": "", "Am": "&",
            "Le": "\\(<=", "Ge": "\\(>=", "Lq": "\\(lq", "Rq": "\\(rq", "Pi": "\\(*p", "Ne": "\\(!=", "Gt": ">",
            "Lt": "<", "Ba": "|", "Ua": "UNIX", "Ux": "UNIX"}


def _special(name: str) -> str:
    """The character a special-character name stands for ("" if unknown).

    ``_special("em") -> "—"``; ``_special("u00E9") -> "é"``; ``_special("'e") -> "é"``
    """
    found = _SPECIAL.get(name)
    if found is not None:
        return found
    if len(name) == 2:
        if name[0] == "*":
            return _GREEK.get(name[1], "")
        if name[0] in _ACCENTS and name[1].isalpha():
            return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}(?:_[0-9A-Fa-f]{4,6})*", name):
        try:
            return unicodedata.normalize("NFC", "".join(chr(int(p, 16)) for p in name[1:].split("_")))
        except (ValueError, OverflowError):
            return ""
    if name.startswith("char") and name[4:].isdigit():
        return _char(name[4:])
    return ""


def _char(number: str) -> str:
    try:
        code = int(number)
    except ValueError:
        return ""
    return chr(code) if 32 <= code < 0x110000 and code != 127 and not 0xD800 <= code < 0xE000 else ""


def _name(s: str, i: int) -> tuple[str, int]:
    """The name after an escape at ``i``: ``(xx``, ``[name]`` or one character."""
    if i >= len(s):
        return "", i
    if s[i] == "(":
        return s[i + 1:i + 3], i + 3
    if s[i] == "[":
        end = s.find("]", i + 1)
        return (s[i + 1:], len(s)) if end < 0 else (s[i + 1:end], end + 1)
    return s[i], i + 1


def _delimited(s: str, i: int) -> tuple[str, int]:
    """The argument after an escape at ``i``, between two of the character found there."""
    if i >= len(s):
        return "", i
    end = s.find(s[i], i + 1)
    return (s[i + 1:], len(s)) if end < 0 else (s[i + 1:end], end + 1)


def _size(s: str, i: int) -> int:
    """Where ``\\s``'s argument ends (``\\s-1``, ``\\s+2``, ``\\s0``, ``\\s(12``, ``\\s[12]``, ``\\s'12'``)."""
    n = len(s)
    signed = i < n and s[i] in "+-"
    if signed:
        i += 1
    if i >= n:
        return i
    c = s[i]
    if c in "([":
        return _name(s, i)[1]
    if c == "'":
        return _delimited(s, i)[1]
    if c.isdigit():
        return i + 2 if not signed and c in "123" and i + 1 < n and s[i + 1].isdigit() else i + 1
    return i


def _strip_comment(s: str) -> str:
    """``s`` up to its comment (``\\"`` or ``\\#``), escapes such as ``\\\\"`` not mistaken for one."""
    i = s.find("\\")
    while i >= 0:
        if s[i + 1:i + 2] in ('"', "#"):
            return s[:i]
        i = s.find("\\", i + 2)
    return s


def _continued(s: str) -> tuple[str, bool]:
    """``s`` without a closing ``\\c``, and whether it had one (the next line goes on without a space)."""
    t = s.rstrip()
    if t.endswith("\\c"):
        k = len(t) - 2
        j = k
        while j > 0 and t[j - 1] == "\\":
            j -= 1
        if (k - j) % 2 == 0:
            return t[:k], True
    return s, False


def _braces(s: str) -> int:
    """How many more ``\\{`` than ``\\}`` ``s`` holds."""
    if "\\" not in s:
        return 0
    depth = 0
    for m in re.finditer(r"\\(.)", s):
        if m.group(1) == "{":
            depth += 1
        elif m.group(1) == "}":
            depth -= 1
    return depth


def _args(s: str) -> list[str]:
    """A macro's arguments as roff splits them: on spaces, ``"quoted words"``
    one argument (``""`` a quote inside), an escaped space not a split."""
    args, i, n = [], 0, len(s)
    while i < n:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            break
        if s[i] == '"':
            i += 1
            buf = []
            while i < n:
                c = s[i]
                if c == '"':
                    if s[i + 1:i + 2] == '"':
                        buf.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                if c == "\\" and i + 1 < n:
                    buf.append(s[i:i + 2])
                    i += 2
                    continue
                buf.append(c)
                i += 1
            args.append("".join(buf))
        else:
            j = i
            while j < n and s[j] not in " \t":
                j += 2 if s[j] == "\\" else 1
            args.append(s[i:j])
            i = j
    return args


def _logical_lines(text: str) -> list[str]:
    """The page's lines, a line ending in an unescaped backslash joined to the next."""
    out: list[str] = []
    carry = ""
    for line in text.split("\n"):
        if line.endswith("\\") and (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            carry += line[:-1]
            continue
        out.append(carry + line if carry else line)
        carry = ""
    if carry:
        out.append(carry)
    return out


def _squash(s: str) -> str:
    return " ".join(s.split())


_MARKER = re.compile(r"[•*+\-o·–—■□◦‣∙]|\(?\d{1,3}[.)]?|\(?[a-zA-Z][.)]|\([a-zA-Z]\)|\[\d{1,3}\]|[ivxIVX]{1,5}[.)]")
_BULLETS = frozenset("•*+-o·■□◦‣∙")


def _marker(tag: str) -> str | None:
    """The list marker a tag is ("•" for any bullet, "2." as written), None if it is a term."""
    tag = tag.strip()
    if not _MARKER.fullmatch(tag):
        return None
    return "•" if tag in _BULLETS else tag


# -- numbers, as .if and .nr read them --------------------------------------------

_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|<=|>=|==|<>|[-+*/%<>=&:()!]|.", re.S)


def _evaluate(expr: str) -> float:
    """A roff numeric expression (left to right, parentheses first; units
    dropped), 0 for what cannot be read."""
    expr = re.sub(r"(?<=[\d.])[icpPmMnvusfz]", "", expr[:200])
    tokens = _TOKEN.findall(expr)
    value, _ = _expression(tokens, 0, 0)
    return value


def _expression(tokens: list[str], pos: int, depth: int) -> tuple[float, int]:
    value, pos = _operand(tokens, pos, depth)
    while pos < len(tokens) and tokens[pos] in _OPS:
        op = tokens[pos]
        right, pos = _operand(tokens, pos + 1, depth)
        value = _OPS[op](value, right)
    return value, pos


def _operand(tokens: list[str], pos: int, depth: int) -> tuple[float, int]:
    if pos >= len(tokens):
        return 0.0, pos
    token = tokens[pos]
    if token == "(" and depth < 32:
        value, pos = _expression(tokens, pos + 1, depth + 1)
        return value, pos + 1 if pos < len(tokens) and tokens[pos] == ")" else pos
    if token in ("-", "+", "!") and depth < 32:
        value, pos = _operand(tokens, pos + 1, depth + 1)
        return (-value if token == "-" else float(value <= 0) if token == "!" else value), pos
    try:
        return float(token), pos + 1
    except ValueError:
        return 0.0, pos + 1


_OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else 0.0, "%": lambda a, b: a % b if b else 0.0,
    "<": lambda a, b: float(a < b), ">": lambda a, b: float(a > b), "<=": lambda a, b: float(a <= b),
    ">=": lambda a, b: float(a >= b), "=": lambda a, b: float(a == b), "==": lambda a, b: float(a == b),
    "<>": lambda a, b: float(a != b), "&": lambda a, b: float(a > 0 and b > 0), ":": lambda a, b: float(a > 0 or b > 0),
}


# -- mdoc, read plainly --------------------------------------------------------------

_MDOC = frozenset("""Ac Ad An Ao Ap Aq Ar At Bc Bd Bf Bk Bl Bo Bq Brc Bro Brq Bsx Bt Bx Cd Cm D1 Db Dc Dd Dl Do Dq Dt
Dv Dx Ec Ed Ef Ek El Em En Eo Er Es Ev Ex Fa Fc Fd Fl Fn Fo Fr Ft Fx Hf Ic In It Lb Li Lk Lp Ms Mt Nd Nm No Ns Nx Oc
Oo Op Os Ot Ox Pa Pc Pf Po Pp Pq Qc Ql Qo Qq Re Rs Rv Sc Sh Sm So Sq Ss St Sx Sy Ta Tn Ud Ux Va Vt Xc Xo Xr %A %B
%C %D %I %J %N %O %P %Q %R %T %U %V""".split())
_MDOC_OPEN = {"Op": ("[", "]"), "Oo": ("[", ""), "Pq": ("(", ")"), "Po": ("(", ""), "Dq": ("“", "”"),
              "Do": ("“", ""), "Sq": ("‘", "’"), "So": ("‘", ""), "Qq": ('"', '"'), "Qo": ('"', ""),
              "Bq": ("[", "]"), "Bo": ("[", ""), "Brq": ("{", "}"), "Bro": ("{", ""), "Aq": ("⟨", "⟩"),
              "Ao": ("⟨", "")}
_MDOC_CLOSE = {"Oc": "]", "Pc": ")", "Dc": "”", "Sc": "’", "Qc": '"', "Bc": "]", "Brc": "}", "Ac": "⟩"}
_MDOC_FLAGGED = frozenset({"Bl", "Bd", "Bf", "Ex", "Rv", "An", "St", "Bk", "Lb", "Db", "Sm"})
_PUNCTUATION = frozenset({".", ",", ";", ":", ")", "]", "?", "!", "}"})


# -- the reader ------------------------------------------------------------------------


@dataclass
class _Item:
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


class _Cursor:
    __slots__ = ("lines", "i")

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.i = lines, 0

    def next(self) -> str | None:
        if self.i >= len(self.lines):
            return None
        self.i += 1
        return self.lines[self.i - 1]


class _Reader:
    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.length = 0
        self.units: list[Unit] = []
        self.headings: list[tuple[int, int, str]] = []
        self.heading = ""
        self.title: str | None = None
        self.name_line: str | None = None
        self.frames: list[_Item | None] = [None]
        self.para: list[list[str]] = []  # the paragraph's lines, each as its pieces (joined once, when written)
        self.para_nf = False
        self.para_len = 0
        self.nf = False
        self.nospace = False
        self.capture: tuple[str, object] | None = None  # ("heading", level) or ("term", _Item)
        self.captured: list[str] = []
        self.after_term: _Item | None = None
        self.strings: dict[str, str] = dict(_STRINGS)
        self.macros: dict[str, list[str]] = {}
        self.registers: dict[str, float] = {".g": 1.0, ".H": 1.0, ".V": 1.0}
        self.conditions: list[bool] = []
        self.expanded = 0
        self.links: list[tuple[str, int]] = []
        self.so_target: str | None = None
        self.mdoc_name = ""
        self.lists: list[str] = []
        self.enum: list[int] = []

    # -- reading ----------------------------------------------------------

    def read(self, text: str) -> LoadedDocument:
        self._run(_Cursor(_logical_lines(text)), 0)
        self._end_capture()
        self._reset()
        if not self.length and self.so_target:
            base = self.so_target.rsplit("/", 1)[-1]
            m = re.fullmatch(r"(.+)\.([1-9]\w*?)(?:\.gz)?", base)
            self._paragraph([f"See {m.group(1)}({m.group(2)})." if m else f"See {base}."], "text", "")
        title = self.title
        if title and self.name_line:
            m = re.search(r"\s[-–—]+\s+(.+)", self.name_line)
            if m:
                title = f"{title} — {m.group(1).strip()}"
        self.units.sort(key=lambda u: u.start)
        return LoadedDocument("".join(self.parts), title=title, headings=tuple(self.headings), units=tuple(self.units))

    def _run(self, cursor: _Cursor, depth: int) -> None:
        while (line := cursor.next()) is not None:
            self._line(line, cursor, depth)

    def _line(self, line: str, cursor: _Cursor, depth: int) -> None:
        if line[:1] in (".", "'"):
            self._control(line[1:], cursor, depth)
        else:
            self._text_line(line)

    def _text_line(self, line: str) -> None:
        if not line.strip():
            self._blank()
            return
        line, more = _continued(_strip_comment(line))
        if line[:1] in (" ", "\t") and not self.nf:
            self._break()
        text = self._render(line)
        if not text.strip() and re.fullmatch(r"(?:\\[{}]|\s)*", line):
            return  # only the end of a conditional block
        if text.strip() or (self.nf and not self.capture):
            self._add(text, more)
        elif more:
            self.nospace = True

    # -- control lines ------------------------------------------------------

    def _control(self, body: str, cursor: _Cursor, depth: int) -> None:
        body = _strip_comment(body).lstrip(" \t")
        if not body or body[0] == "\\":
            return
        m = re.match(r"\S+", body)
        name, rest = m.group(), body[m.end():]
        if name in ("if", "ie", "el", "while"):
            self._conditional(name, rest, cursor, depth)
            return
        if name in ("de", "de1", "am", "am1", "ig", "dei", "ami", "dei1", "ami1"):
            self._define(name, rest, cursor)
            return
        if name == "TS":
            self._table(cursor)
            return
        if name in ("ds", "ds1", "as", "as1"):
            self._string(name, rest)
            return
        rest, more = _continued(rest)
        args = _args(rest)
        handler = _MACROS.get(name)
        if handler is not None:
            handler(self, args, more)
        elif name in self.macros and depth < MAX_MACRO_DEPTH and self.expanded < MAX_MACRO_LINES:
            self._expand(name, args, depth)
        elif name in _MDOC:
            self._mdoc(name, args)
        elif name == "nop":
            self._text_line(rest.lstrip())
        elif name == "do" and rest.strip():
            self._control(rest, cursor, depth)
        elif name in _REQUESTS:
            _REQUESTS[name](self, args, rest)
        elif not name[:1].islower() and any(any(c.isalpha() for c in self._render(a)) for a in args):
            self._add(" ".join(self._render(a) for a in args), more)  # an unknown macro: its words kept

    def _conditional(self, name: str, rest: str, cursor: _Cursor, depth: int) -> None:
        if name == "el":
            holds = not self.conditions.pop() if self.conditions else False
        else:
            holds, rest = self._condition(rest)
            if name == "ie":
                self.conditions.append(holds)
            elif name == "while":
                holds = False  # loops are not run
        rest = rest.lstrip(" \t")
        if not holds:
            open_ = _braces(rest)
            while open_ > 0 and (line := cursor.next()) is not None:
                open_ += _braces(line)
            return
        if rest.startswith("\\{"):
            rest = rest[2:].lstrip(" \t")
        if rest.strip():
            self._line(rest, cursor, depth)

    def _condition(self, s: str) -> tuple[bool, str]:
        """Whether an ``.if`` condition holds (read as nroff: ``n`` true,
        ``t`` false), and the rest of the line."""
        s = s.lstrip(" \t")
        negate = False
        while s.startswith("!"):
            negate, s = not negate, s[1:]
        if not s:
            return False, ""
        c = s[0]
        if c in "ntoev" and (len(s) == 1 or not s[1].isalnum()):
            return (c in "no") != negate, s[1:]
        if c in "drmcFS" and len(s) > 1 and s[1] in " \t":
            parts = s[1:].split(None, 1)
            name = parts[0] if parts else ""
            holds = ((c == "d" and (name in self.strings or name in self.macros))
                     or (c == "r" and name in self.registers))
            return holds != negate, parts[1] if len(parts) > 1 else ""
        if not (c.isdigit() or c in "\\(+-."):
            first = s.find(c, 1)
            second = s.find(c, first + 1) if first >= 0 else -1
            if second < 0:
                return False, ""
            holds = self._render(s[1:first]) == self._render(s[first + 1:second])
            return holds != negate, s[second + 1:]
        m = re.match(r"\S+", s)
        return (self._number(m.group()) > 0) != negate, s[m.end():]

    def _number(self, expr: str) -> float:
        expr = re.sub(r"\\n[-+]?(\(..|\[[^\]]*\]|.)",
                      lambda m: f"{self.registers.get(m.group(1).strip('([]'), 0.0):g}", expr)
        expr = re.sub(r"\\w(.)(.*?)\1", lambda m: str(len(self._render(m.group(2)))), expr)
        return _evaluate(self._render(expr))

    def _define(self, name: str, rest: str, cursor: _Cursor) -> None:
        args = _args(rest)
        target = args[0] if args else ""
        end = args[1] if len(args) > 1 else "."
        closing = re.compile(r"[.']\s*" + re.escape(end) + r"(?:\s|\\\"|$)")
        body = []
        while (line := cursor.next()) is not None and not closing.match(line):
            body.append(line)
        if name == "ig" or not target or name.startswith(("dei", "ami")):
            return
        copied = [self._copy(line) for line in body]
        if name.startswith("am"):
            copied = self.macros.get(target, []) + copied
        check_text(sum(len(line) for line in copied), self.max_chars)
        self.macros[target] = copied

    def _string(self, name: str, rest: str) -> None:
        m = re.match(r"[ \t]*(\S+)[ \t]*", rest)
        if not m:
            return
        value = rest[m.end():]
        if value.startswith('"'):
            value = value[1:]
        value = self._copy(value)
        if name.startswith("as"):
            value = self.strings.get(m.group(1), "") + value
        check_text(len(value), self.max_chars)
        self.strings[m.group(1)] = value

    def _copy(self, s: str) -> str:
        """``s`` read in copy mode: ``\\\\`` as one backslash, strings put in."""
        if "\\" not in s:
            return s
        size = len(s)

        def put(m: re.Match) -> str:
            nonlocal size
            if m.group(1):
                return "\\"
            value = self.strings.get(m.group(2).strip("([]").split(" ")[0], "")
            size += len(value)
            check_text(size, self.max_chars)  # a string of strings of strings: refused before it is built
            return value

        return re.sub(r"\\(?:(\\)|\*(\(..|\[[^\]]*\]|.))", put, s)

    def _expand(self, name: str, args: list[str], depth: int) -> None:
        body = self.macros[name]
        self.expanded += len(body)

        def arg(m: re.Match) -> str:
            key = m.group(1).strip("([]")
            if key in ("*", "@"):
                return " ".join(args) if key == "*" else " ".join(f'"{a}"' for a in args)
            if key == "0":
                return name
            if key.isdigit() and 0 < int(key) <= len(args):
                return args[int(key) - 1]
            return ""

        lines = []
        for line in body:
            if "\\" in line:
                line = re.sub(r"\\\$(\(\d\d|\[\d+\]|\d|\*|@)", arg, line)
                line = re.sub(r"\\n(?:\(\.\$|\[\.\$\])", str(len(args)), line)
            check_text(len(line), self.max_chars)
            lines.append(line)
        self._run(_Cursor(lines), depth + 1)

    # -- escapes -----------------------------------------------------------------

    def _render(self, s: str, depth: int = 0) -> str:
        """Text with its escapes read: fonts and sizes dropped, special
        characters and strings put in, unknown escapes dropped."""
        if "\\" not in s:
            return s
        out: list[str] = []
        size, i, n = 0, 0, len(s)
        while i < n:
            j = s.find("\\", i)
            if j < 0:
                out.append(s[i:])
                break
            out.append(s[i:j])
            if j + 1 >= n:
                break
            c = s[j + 1]
            i = j + 2
            simple = _SIMPLE.get(c)
            if simple is not None:
                out.append(simple)
            elif c in ('"', "#"):
                break
            elif c == "(":
                out.append(_special(s[i:i + 2]))
                i += 2
            elif c == "[":
                name, i = _name(s, i - 1)
                out.append(_special(name.split(" ")[0]))
            elif c in _NAMED:
                i = _name(s, i)[1]
            elif c == "n":
                i = _name(s, i + 1 if s[i:i + 1] in ("+", "-") else i)[1]
            elif c == "s":
                i = _size(s, i)
            elif c == "*":
                name, i = _name(s, i)
                value = self.strings.get(name.split(" ")[0], "") if depth < 8 else ""
                piece = self._render(value, depth + 1)
                size += len(piece)
                check_text(size, self.max_chars)
                out.append(piece)
            elif c == "C":
                name, i = _delimited(s, i)
                out.append(_special(name))
            elif c == "N":
                number, i = _delimited(s, i)
                out.append(_char(number))
            elif c in _DELIMITED:
                i = _delimited(s, i)[1]
        return "".join(out)

    # -- the text ----------------------------------------------------------------

    def _write(self, s: str) -> None:
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

    def _add(self, text: str, more: bool = False) -> None:
        """A line's text: into the heading or term being read, else the paragraph."""
        if self.capture is not None:
            self.captured.append(text if self.nospace or not self.captured else " " + text)
            self.para_len += len(text) + 1
            check_text(self.length + self.para_len, self.max_chars)
            self.nospace = more
            if not more:
                self._end_capture()
            return
        if self.para and self.para_nf != self.nf:
            self._flush()
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

    def _break(self) -> None:
        if self.para and not self.para_nf and self.para[-1]:
            self.para.append([])
        self.nospace = False

    def _blank(self) -> None:
        if self.capture is not None:
            return
        if self.nf:
            if self.para and self.para_nf:
                self.para.append([])
        else:
            self._flush()
        self.nospace = False

    def _item(self) -> _Item | None:
        return next((item for item in reversed(self.frames) if item is not None), None)

    def _new(self, kind: str, marker: str = "") -> _Item:
        """An item at this depth, in the enclosing item (else under the heading)."""
        outer = next((item for item in reversed(self.frames[:-1]) if item is not None), None)
        about = outer.about if outer is not None else self.heading
        return _Item(kind, about, about != self.heading, marker)

    def _flush(self) -> None:
        """Write the paragraph being read, with its units."""
        if not self.para:
            return
        lines, nf = ["".join(pieces) for pieces in self.para], self.para_nf
        self.para, self.para_len, self.nospace = [], 0, False
        item = self._item()
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
                    self._unit(a, line, "code", about)
            return
        lines = [line for line in map(_squash, lines) if line]
        if not lines:
            return
        kind = item.kind if item is not None else "text"
        if item is not None and item.marker:
            lines[0] = f"{item.marker} {lines[0]}"
        self._paragraph(lines, kind, about, len(item.marker) + 1 if item is not None and item.marker else 0)
        if item is not None:
            item.marker = ""
        if self.name_line is None and len(self.headings) == 1 and kind == "text":
            line = " ".join(lines)  # the NAME line: "tcp - TCP protocol"
            if self.headings[0][2].upper() in _NAME_HEADINGS or len(line) < 300:
                self.name_line = line

    def _paragraph(self, lines: list[str], kind: str, about: str, skip: int = 0) -> None:
        self._described()
        spans = self._block(lines)
        if kind == "text":
            for (a, _), line in zip(spans, lines):
                for x, y in sentences(line):
                    self._unit(a + x, line[x:y], kind, about)
        else:
            self._unit(spans[0][0] + skip, "\n".join(lines)[skip:], kind, about)

    def _unit(self, at: int, text: str, kind: str, about: str) -> None:
        """A unit of ``text``, written at ``at`` (stripped; none without a word)."""
        span = stripped(text, 0, len(text))
        if span is not None and any(c.isalnum() for c in text[span[0]:span[1]]):
            self.units.append(Unit(at + span[0], at + span[1], kind, about))

    def _described(self) -> None:
        for item in self.frames:
            if item is not None:
                item.described = True

    def _close(self, item: _Item | None) -> None:
        """An item ends: a term that got no description is a unit itself."""
        if item is not None and not item.described:
            for (a, _), term in zip(item.term_spans, item.terms):
                self._unit(a, term, "definition", item.about)

    def _reset(self) -> None:
        """Back to the margin (a heading): every item ends."""
        self._flush()
        while self.frames:
            self._close(self.frames.pop())
        self.frames = [None]

    def _set(self, item: _Item | None) -> None:
        self._flush()
        self._close(self.frames[-1])
        self.frames[-1] = item

    def _end_capture(self) -> None:
        if self.capture is None:
            return
        (kind, target), text = self.capture, _squash("".join(self.captured))
        self.capture, self.captured, self.nospace, self.para_len = None, [], False, 0
        if kind == "heading":
            self._heading(target, text)  # type: ignore[arg-type]
        else:
            self._term(target, text)  # type: ignore[arg-type]

    def _heading(self, level: int, text: str) -> None:
        if not text:
            return
        self._reset()
        (a, _), = self._block([text])
        self.headings.append((a, level, text))
        self.heading = text
        self._unit(a, text, "heading", text)

    def _term(self, item: _Item, text: str) -> None:
        if not text:
            return
        self._flush()
        tight = self.after_term is item
        (a, b), = self._block([text], tight=tight)
        item.terms.append(text)
        item.term_spans.append((a, b))
        self.after_term = item

    # -- man macros ------------------------------------------------------------------

    def _th(self, args: list[str], more: bool) -> None:
        self._end_capture()
        self._reset()
        self.nf = False
        if args:
            name = _squash(self._render(args[0]))
            section = _squash(self._render(args[1])) if len(args) > 1 else ""
            self.title = f"{name}({section})" if section else name

    def _sh(self, args: list[str], more: bool, level: int = 1) -> None:
        self._end_capture()
        self._reset()
        self.nf = False
        text = _squash(" ".join(self._render(a) for a in args))
        if text:
            self._heading(level, text)
        else:
            self.capture, self.captured = ("heading", level), []

    def _ss(self, args: list[str], more: bool) -> None:
        self._sh(args, more, 2)

    def _pp(self, args: list[str], more: bool) -> None:
        self._end_capture()
        self._set(None)

    def _tp(self, args: list[str], more: bool) -> None:
        self._end_capture()
        item = self._new("definition")
        self._set(item)
        self.capture, self.captured = ("term", item), []

    def _tq(self, args: list[str], more: bool) -> None:
        self._end_capture()
        item = self.frames[-1]
        if item is None or item.kind != "definition":
            self._tp(args, more)
            return
        self._flush()
        self.capture, self.captured = ("term", item), []

    def _ip(self, args: list[str], more: bool) -> None:
        self._end_capture()
        tag = _squash(self._render(args[0])) if args else ""
        if not tag:
            self._flush()  # a paragraph more of the item at this depth, if any
            return
        marker = _marker(tag)
        if marker is not None:
            self._set(self._new("item", marker))
            return
        item = self._new("definition")
        self._set(item)
        self._term(item, tag)

    def _rs(self, args: list[str], more: bool) -> None:
        self._end_capture()
        self._flush()
        self.frames.append(None)

    def _re(self, args: list[str], more: bool) -> None:
        self._end_capture()
        self._flush()
        keep = max(1, int(_evaluate(args[0]))) if args else len(self.frames) - 1
        while len(self.frames) > max(1, keep):
            self._close(self.frames.pop())

    def _font(self, args: list[str], more: bool) -> None:
        if args:
            self._add(" ".join(self._render(a) for a in args), more)

    def _alternating(self, args: list[str], more: bool) -> None:
        if args:
            self._add("".join(self._render(a) for a in args), more)

    def _nf(self, args: list[str], more: bool) -> None:
        self._flush()
        self.nf = True

    def _fi(self, args: list[str], more: bool) -> None:
        self._flush()
        self.nf = False

    def _br(self, args: list[str], more: bool) -> None:
        if self.capture is None:
            self._break()

    def _sp(self, args: list[str], more: bool) -> None:
        self._blank()

    def _ur(self, args: list[str], more: bool) -> None:
        self.links.append((self._render(args[0]) if args else "", self.para_len))

    def _ue(self, args: list[str], more: bool) -> None:
        if not self.links:
            return
        url, at = self.links.pop()
        trailing = "".join(self._render(a) for a in args)
        if url:
            self._add(f"<{url}>" if self.para_len > at else url, bool(trailing))
        if trailing:
            self._add(trailing, more)

    def _sy(self, args: list[str], more: bool) -> None:
        self._flush()
        if args:
            self._add(self._render(args[0]), more)

    def _op(self, args: list[str], more: bool) -> None:
        if args:
            self._add("[" + " ".join(self._render(a) for a in args) + "]", more)

    def _mr(self, args: list[str], more: bool) -> None:
        if args:
            section = f"({self._render(args[1])})" if len(args) > 1 else ""
            self._add(self._render(args[0]) + section + "".join(self._render(a) for a in args[2:]), more)

    def _ignore(self, args: list[str], more: bool) -> None:
        pass

    # -- requests --------------------------------------------------------------------

    def _nr(self, args: list[str], rest: str) -> None:
        if len(args) >= 2:
            value = self._number(args[1].lstrip("+-"))
            old = self.registers.get(args[0], 0.0)
            sign = args[1][:1]
            self.registers[args[0]] = old + value if sign == "+" else old - value if sign == "-" else value

    def _rm(self, args: list[str], rest: str) -> None:
        for name in args:
            self.macros.pop(name, None)
            self.strings.pop(name, None)

    def _als(self, args: list[str], rest: str) -> None:
        if len(args) >= 2:
            if args[1] in self.macros:
                self.macros[args[0]] = self.macros[args[1]]
            elif args[1] in self.strings:
                self.strings[args[0]] = self.strings[args[1]]

    def _so(self, args: list[str], rest: str) -> None:
        if args:
            self.so_target = args[0]

    def _tl(self, args: list[str], rest: str) -> None:
        rest = rest.strip()
        if rest:
            parts = [_squash(self._render(p)) for p in rest[1:].split(rest[0])]
            self._break()
            self._add(" ".join(p for p in parts if p))
            self._break()

    def _request_break(self, args: list[str], rest: str) -> None:
        self._br(args, False)

    # -- tables ------------------------------------------------------------------------

    def _table(self, cursor: _Cursor) -> None:
        """A tbl table, ``.TS`` to ``.TE``: a row a line, kept beside its header."""
        self._end_capture()
        self._flush()
        raw = []
        while (line := cursor.next()) is not None and not re.match(r"[.']\s*TE\b", line):
            raw.append(line)
        tab, at = "\t", 0
        while at < len(raw) and re.match(r"[.']\s*\\\"", raw[at]):
            at += 1
        if at < len(raw) and _strip_comment(raw[at]).rstrip().endswith(";"):
            m = re.search(r"tab\s*\((.)\)", raw[at])
            tab = m.group(1) if m else tab
            at += 1
        formats = []
        while at < len(raw):
            line = _strip_comment(raw[at])
            at += 1
            formats.append(line)
            if line.rstrip().endswith("."):
                break
        rows: list[list[str]] = []
        rules: set[int] = set()
        data = _Cursor(raw[at:])
        while (line := data.next()) is not None:
            if line.startswith(".T&"):
                while (spec := data.next()) is not None and not _strip_comment(spec).rstrip().endswith("."):
                    pass
                continue
            if line[:1] in (".", "'"):
                continue  # a request inside the table (.sp, .ft, a comment): nothing to show
            if line.strip() in ("_", "=", "\\_"):
                rules.add(len(rows))
                continue
            cells = self._cells(line, tab, data)
            if any(cells):
                rows.append(cells)
        if not rows:
            return
        specs = [r for r in re.split(r"[,\n]", "\n".join(formats).rstrip().rstrip(".")) if r.strip()]
        header = len(rows) > 1 and (1 in rules or _bold(specs))
        lines, size = [], self.length
        for k, cells in enumerate(rows):
            lines.append(header_text(cells) if header and not k else _row(rows[0], cells) if header
                         else " | ".join(c for c in cells if c))
            size += len(lines[-1]) + 1
            check_text(size, self.max_chars)  # each row says its header again: refused as it grows
        item = self._item()
        about = item.about if item is not None else self.heading
        self._described()
        for (a, _), line in zip(self._block(lines), lines):
            self._unit(a, line, "row", about)

    def _cells(self, line: str, tab: str, data: _Cursor) -> list[str]:
        parts = line.split(tab)
        cells = []
        while parts:
            cell = parts.pop(0)
            if cell.strip() == "T{":
                block = []
                while (more := data.next()) is not None:
                    if more.startswith("T}"):
                        parts = more[2:].split(tab)[1:] + parts
                        break
                    block.append(self._cell_line(more))
                cells.append(_squash(" ".join(block)))
            elif cell.strip() in ("_", "=", "\\_", "\\^", "^") or re.fullmatch(r"\s*\\R.\s*", cell):
                cells.append("")
            else:
                cells.append(_squash(self._render(cell)))
        return cells

    def _cell_line(self, line: str) -> str:
        """A line of a ``T{`` block: its text, a font macro's words, nothing for other requests."""
        if line[:1] not in (".", "'"):
            return self._render(_continued(line)[0])
        body = _strip_comment(line[1:]).strip()
        m = re.match(r"(\S+)\s*(.*)", body)
        if not m:
            return ""
        handler = _MACROS.get(m.group(1))
        args = _args(m.group(2))
        if handler is _Reader._font:
            return " ".join(self._render(a) for a in args)
        if handler is _Reader._alternating:
            return "".join(self._render(a) for a in args)
        return ""

    # -- mdoc --------------------------------------------------------------------------

    def _mdoc(self, name: str, args: list[str]) -> None:
        if name == "Dt":
            if args:
                self.title = f"{args[0]}({args[1]})" if len(args) > 1 else args[0]
        elif name in ("Sh", "Ss"):
            self._sh([self._mdoc_words(args)], False, 1 if name == "Sh" else 2)
        elif name in ("Pp", "Lp"):
            if self.lists:
                self._blank()  # a paragraph more of the list's item
            else:
                self._pp([], False)
        elif name == "Nd":
            self._add("- " + self._mdoc_words(args))
        elif name == "Bl":
            self._rs([], False)
            kind = next((a for a in args if a.startswith("-") and a not in ("-compact", "-offset", "-width")), "-tag")
            self.lists.append(kind)
            self.enum.append(0)
        elif name == "El":
            self._re([], False)
            if self.lists:
                self.lists.pop()
                self.enum.pop()
        elif name == "It":
            self._mdoc_item(args)
        elif name == "Bd":
            self._flush()
            self.nf = "-literal" in args or "-unfilled" in args
        elif name == "Ed":
            self._fi([], False)
        elif name in ("D1", "Dl"):
            self._flush()
            self.nf = name == "Dl"
            self._add(self._mdoc_words(args))
            self._flush()
            self.nf = False
        elif name in ("Rs", "Re"):
            self._flush()
        elif name in ("Dd", "Os", "Bk", "Ek", "Bf", "Ef", "Sm", "Db", "Ud", "Ed"):
            pass
        else:
            words = self._mdoc_words([name, *args])
            if words:
                self._add(words)

    def _mdoc_item(self, args: list[str]) -> None:
        kind = self.lists[-1] if self.lists else "-tag"
        if kind in ("-bullet", "-dash", "-hyphen", "-enum", "-item"):
            if kind == "-enum":
                self.enum[-1] += 1
            number = f"{self.enum[-1] if self.enum else 1}."
            marker = {"-bullet": "•", "-dash": "-", "-hyphen": "-", "-item": ""}.get(kind, number)
            self._set(self._new("item", marker))
            words = self._mdoc_words(args)
            if words:
                self._add(words)
        elif kind == "-column":
            self._set(self._new("item"))
            cells = " ".join(args).replace("\t", " Ta ")
            self._add(" | ".join(w for w in (self._mdoc_words(_args(c)) for c in cells.split(" Ta ")) if w))
        else:
            item = self._new("definition")
            self._set(item)
            self._term(item, self._mdoc_words(args))

    def _mdoc_words(self, tokens: list[str]) -> str:
        """An mdoc line's words: macro names dropped, a flag's dash, a cross
        reference's section and an enclosure's brackets put in."""
        out: list[str] = []
        closers: list[str] = []
        tail = 0  # how many of the last words are closing punctuation
        glue, flag, skip_flags = False, False, bool(tokens) and tokens[0] in _MDOC_FLAGGED
        i = 0
        while i < len(tokens):
            token = tokens[i]
            i += 1
            following = tokens[i] if i < len(tokens) else None
            if token in _MDOC:
                if token == "Ns":
                    glue = True
                elif token == "Fl":
                    flag = True
                    if following is None or following in _MDOC or following in _PUNCTUATION:
                        out.append(("" if glue or not out else " ") + "-")
                        flag, glue = False, False
                elif token == "Xr" and following is not None and following not in _MDOC:
                    section = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in _MDOC else ""
                    word = self._render(following) + (f"({self._render(section)})" if section else "")
                    out.append(("" if glue or not out else " ") + word)
                    i += 2 if section else 1
                    glue = False
                elif token == "Nm" and (following is None or following in _MDOC or following in _PUNCTUATION):
                    out.append(("" if glue or not out else " ") + self.mdoc_name)
                    glue = False
                elif token == "Nm" and not self.mdoc_name and following is not None:
                    self.mdoc_name = self._render(following)
                elif token in _MDOC_OPEN:
                    opener, closer = _MDOC_OPEN[token]
                    out.append(("" if glue or not out else " ") + opener)
                    glue = True
                    if closer:
                        closers.append(closer)
                elif token in _MDOC_CLOSE:
                    out.append(_MDOC_CLOSE[token])
                elif token == "Pf" and following is not None:
                    out.append(("" if glue or not out else " ") + self._render(following))
                    i += 1
                    glue = True
                continue
            if skip_flags and token.startswith("-"):
                continue
            word = self._render(token)
            if flag:
                word, flag = "-" + word, False
            if glue or not out or (token in _PUNCTUATION):
                out.append(word)
            else:
                out.append(" " + word)
            tail = tail + 1 if token in _PUNCTUATION else 0
            glue = False
        trailing = out[len(out) - tail:] if tail else []
        del out[len(out) - len(trailing):]
        out.extend(reversed(closers))
        out.extend(trailing)
        return _squash("".join(out))


def _row(headers: list[str], cells: list[str]) -> str:
    """A body row as "Header: cell" pairs, empty cells left out, a cell under
    no header (a row's own label) alone.

    ``_row(["", "Port"], ["VNC", "5900"]) -> "VNC; Port: 5900"``
    """
    pairs = [f"{headers[i]}: {cell}" if i < len(headers) and headers[i] else cell
             for i, cell in enumerate(cells) if cell]
    return "; ".join(pairs)


def _bold(specs: list[str]) -> bool:
    """Whether a table's format gives its first row (and only it) a bold font."""
    if len(specs) < 2:
        return False
    first = re.sub(r"\([^)]*\)", "", specs[0])
    columns = re.findall(r"([lrcnaLRCNA])([^lrcnasLRCNAS^_=|\s]*)", first)
    return bool(columns) and all(re.search(r"[bB]", mods) for _, mods in columns)


_MACROS = {
    "TH": _Reader._th, "SH": _Reader._sh, "SS": _Reader._ss, "PP": _Reader._pp, "LP": _Reader._pp, "P": _Reader._pp,
    "HP": _Reader._pp, "TP": _Reader._tp, "TQ": _Reader._tq, "IP": _Reader._ip, "RS": _Reader._rs, "RE": _Reader._re,
    "B": _Reader._font, "I": _Reader._font, "SM": _Reader._font, "SB": _Reader._font, "BR": _Reader._alternating,
    "BI": _Reader._alternating, "IR": _Reader._alternating, "RB": _Reader._alternating, "RI": _Reader._alternating,
    "IB": _Reader._alternating, "nf": _Reader._nf, "fi": _Reader._fi, "EX": _Reader._nf, "EE": _Reader._fi,
    "Vb": _Reader._nf, "Ve": _Reader._fi, "br": _Reader._br, "sp": _Reader._sp, "Sp": _Reader._sp,
    "UR": _Reader._ur, "UE": _Reader._ue, "MT": _Reader._ur, "ME": _Reader._ue, "SY": _Reader._sy, "OP": _Reader._op,
    "YS": _Reader._fi, "MR": _Reader._mr, "PD": _Reader._ignore, "DT": _Reader._ignore, "UC": _Reader._ignore,
    "AT": _Reader._ignore, "IX": _Reader._ignore, "UN": _Reader._ignore, "TE": _Reader._ignore,
    "bp": _Reader._br, "ce": _Reader._ignore,
}
# Requests that matter when read as text; every other lower-case request is ignored.
_REQUESTS = {
    "nr": _Reader._nr, "rm": _Reader._rm, "als": _Reader._als, "so": _Reader._so, "tl": _Reader._tl,
    "in": _Reader._request_break, "ti": _Reader._request_break,
}
