"""The roff engine under a man page: its lines (comments, ``\\c`` and
backslash continuations, a macro's arguments), the page's strings
(``.ds``/``.as``), registers (``.nr``), macros (``.de``/``.am``, expanded to a
bounded depth and a bounded number of lines), conditionals
(``.if``/``.ie``/``.el``, read as nroff would: ``n`` true, ``t`` false,
``\\n(.g`` set) and escapes (see ``roff_escapes``), read in copy mode where
roff does.

Every string, macro and expansion is checked against the text limit as it
is built, so a page of strings of strings is refused before it grows.

Does not: know what a macro package's macros mean (``man`` and ``mdoc``
are ``man``'s and ``mdoc``'s), run loops, or lay text out.
"""

from __future__ import annotations

import re
from typing import Mapping

from .document import check_text
from .roff_escapes import render_escapes
from .roff_numbers import evaluate

MAX_MACRO_DEPTH = 16  # a page's own macros calling each other
MAX_MACRO_LINES = 100_000  # lines a page's macros may expand to, in all (the most seen: 23,210, cmake-modules.7)


def strip_comment(s: str) -> str:
    """``s`` up to its comment (``\\"`` or ``\\#``), escapes such as ``\\\\"`` not mistaken for one."""
    i = s.find("\\")
    while i >= 0:
        if s[i + 1:i + 2] in ('"', "#"):
            return s[:i]
        i = s.find("\\", i + 2)
    return s


def continued(s: str) -> tuple[str, bool]:
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


def braces(s: str) -> int:
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


def macro_args(s: str) -> list[str]:
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


def logical_lines(text: str) -> list[str]:
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


def squash(s: str) -> str:
    """``s`` with each run of white space one space, none at its ends."""
    return " ".join(s.split())


class Cursor:
    """A run of lines read one at a time: a request that spans lines (a
    macro definition, a skipped block, a table) reads on from it."""

    __slots__ = ("lines", "i")

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.i = lines, 0

    def next(self) -> str | None:
        """The next line, None after the last."""
        if self.i >= len(self.lines):
            return None
        self.i += 1
        return self.lines[self.i - 1]


class Roff:
    """The state roff keeps while it reads a page: strings, registers,
    macros and the ``.ie`` conditions waiting for their ``.el``. Text put
    in (strings, macro bodies) is checked against ``max_chars``."""

    def __init__(self, max_chars: int, strings: Mapping[str, str]) -> None:
        self.max_chars = max_chars
        self.strings: dict[str, str] = dict(strings)  # the macro package's own, then the page's
        self.macros: dict[str, list[str]] = {}
        self.registers: dict[str, float] = {".g": 1.0, ".H": 1.0, ".V": 1.0}
        self.conditions: list[bool] = []
        self.expanded = 0  # lines the page's macros have expanded to, in all

    def render(self, s: str) -> str:
        """``s`` with its escapes read (see :func:`.roff_escapes.render_escapes`)."""
        return render_escapes(s, self.strings, self.max_chars)

    def conditional(self, name: str, rest: str, cursor: Cursor) -> str:
        """An ``.if``, ``.ie``, ``.el`` or ``.while`` line (its ``rest`` after
        the request's name): the rest of the line to read when its condition
        holds, else "" with the ``\\{ ... \\}`` block it opens skipped, read
        from ``cursor``. An ``.el`` takes the last ``.ie``'s condition, negated;
        a loop is not run (its condition never holds)."""
        if name == "el":
            holds = not self.conditions.pop() if self.conditions else False
        else:
            holds, rest = self.condition(rest)
            if name == "ie":
                self.conditions.append(holds)
            elif name == "while":
                holds = False  # loops are not run
        rest = rest.lstrip(" \t")
        if not holds:
            open_ = braces(rest)
            while open_ > 0 and (line := cursor.next()) is not None:
                open_ += braces(line)
            return ""
        if rest.startswith("\\{"):
            rest = rest[2:].lstrip(" \t")
        return rest

    def condition(self, s: str) -> tuple[bool, str]:
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
            holds = self.render(s[1:first]) == self.render(s[first + 1:second])
            return holds != negate, s[second + 1:]
        m = re.match(r"\S+", s)
        return (self.number(m.group()) > 0) != negate, s[m.end():]

    def number(self, expr: str) -> float:
        """The value of a numeric expression, its registers (``\\n(xx``) and
        widths (``\\w'...'``) put in and its escapes read (see :func:`.roff_numbers.evaluate`)."""
        expr = re.sub(r"\\n[-+]?(\(..|\[[^\]]*\]|.)",
                      lambda m: f"{self.registers.get(m.group(1).strip('([]'), 0.0):g}", expr)
        expr = re.sub(r"\\w(.)(.*?)\1", lambda m: str(len(self.render(m.group(2)))), expr)
        return evaluate(self.render(expr))

    def define(self, name: str, rest: str, cursor: Cursor) -> None:
        """A macro definition (``.de``, ``.am`` and their kin; ``.ig`` a
        comment): its body read from ``cursor`` up to its closing line, kept
        in copy mode (``.am`` adds to it; the indirect ``.dei``/``.ami`` are
        skipped)."""
        args = macro_args(rest)
        target = args[0] if args else ""
        end = args[1] if len(args) > 1 else "."
        closing = re.compile(r"[.']\s*" + re.escape(end) + r"(?:\s|\\\"|$)")
        body = []
        while (line := cursor.next()) is not None and not closing.match(line):
            body.append(line)
        if name == "ig" or not target or name.startswith(("dei", "ami")):
            return
        copied = [self.copy(line) for line in body]
        if name.startswith("am"):
            copied = self.macros.get(target, []) + copied
        check_text(sum(len(line) for line in copied), self.max_chars)
        self.macros[target] = copied

    def define_string(self, name: str, rest: str) -> None:
        """A string definition, ``.ds name value`` (``.as`` adds to it), in copy mode."""
        m = re.match(r"[ \t]*(\S+)[ \t]*", rest)
        if not m:
            return
        value = rest[m.end():]
        if value.startswith('"'):
            value = value[1:]
        value = self.copy(value)
        if name.startswith("as"):
            value = self.strings.get(m.group(1), "") + value
        check_text(len(value), self.max_chars)
        self.strings[m.group(1)] = value

    def copy(self, s: str) -> str:
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

    def can_expand(self, name: str, depth: int) -> bool:
        """Whether ``name`` is the page's own macro and may be expanded at
        this ``depth`` of macros calling macros (within the bounds on depth
        and on the lines expanded in all)."""
        return name in self.macros and depth < MAX_MACRO_DEPTH and self.expanded < MAX_MACRO_LINES

    def expansion(self, name: str, args: list[str]) -> list[str]:
        """The lines the page's macro ``name`` expands to with ``args``
        (``\\$1``, ``\\$*``, ``\\$@``, ``\\$0`` and ``\\n(.$`` put in), counted
        against the bound on lines expanded."""
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
        return lines

    # -- requests the engine keeps: registers, removals, aliases ---------------

    def set_register(self, args: list[str]) -> None:
        """``.nr name value``: a register set, or (``+n``/``-n``) moved by ``n``."""
        if len(args) >= 2:
            value = self.number(args[1].lstrip("+-"))
            old = self.registers.get(args[0], 0.0)
            sign = args[1][:1]
            self.registers[args[0]] = old + value if sign == "+" else old - value if sign == "-" else value

    def remove(self, args: list[str]) -> None:
        """``.rm name ...``: macros and strings removed."""
        for name in args:
            self.macros.pop(name, None)
            self.strings.pop(name, None)

    def alias(self, args: list[str]) -> None:
        """``.als new old``: a second name for a macro or a string."""
        if len(args) >= 2:
            if args[1] in self.macros:
                self.macros[args[0]] = self.macros[args[1]]
            elif args[1] in self.strings:
                self.strings[args[0]] = self.strings[args[1]]


# Requests that only change the engine's state: name -> the Roff method that reads them (from their arguments).
ROFF_REQUESTS = {"nr": Roff.set_register, "rm": Roff.remove, "als": Roff.alias}
