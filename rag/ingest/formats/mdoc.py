"""mdoc pages (``.Dd``/``.Dt``/``.Sh``, as BSD pages write them) read
plainly: headings, paragraphs, lists (``.Bl``/``.It``/``.El``: bullets,
numbers, tags and columns), displays (``.Bd``/``.Ed``, ``.D1``, ``.Dl``),
the macro names dropped and their words kept, with a flag's dash, a cross
reference's section, an enclosure's brackets and the page's name (a bare
``.Nm``) put in.

Does not: read the semantic markup (``.Fn``, ``.Ar``, ``.Ev`` ... are their
words), the page's date or its operating system.
"""

from __future__ import annotations

from typing import Callable

from .man_text import PageText
from .roff import macro_args, squash

MDOC_MACROS = frozenset("""Ac Ad An Ao Ap Aq Ar At Bc Bd Bf Bk Bl Bo Bq Brc Bro Brq Bsx Bt Bx Cd Cm D1 Db Dc Dd Dl Do
Dq Dt Dv Dx Ec Ed Ef Ek El Em En Eo Er Es Ev Ex Fa Fc Fd Fl Fn Fo Fr Ft Fx Hf Ic In It Lb Li Lk Lp Ms Mt Nd Nm No Ns
Nx Oc Oo Op Os Ot Ox Pa Pc Pf Po Pp Pq Qc Ql Qo Qq Re Rs Rv Sc Sh Sm So Sq Ss St Sx Sy Ta Tn Ud Ux Va Vt Xc Xo Xr %A
%B %C %D %I %J %N %O %P %Q %R %T %U %V""".split())
_MDOC_OPEN = {"Op": ("[", "]"), "Oo": ("[", ""), "Pq": ("(", ")"), "Po": ("(", ""), "Dq": ("“", "”"),
              "Do": ("“", ""), "Sq": ("‘", "’"), "So": ("‘", ""), "Qq": ('"', '"'), "Qo": ('"', ""),
              "Bq": ("[", "]"), "Bo": ("[", ""), "Brq": ("{", "}"), "Bro": ("{", ""), "Aq": ("⟨", "⟩"),
              "Ao": ("⟨", "")}
_MDOC_CLOSE = {"Oc": "]", "Pc": ")", "Dc": "”", "Sc": "’", "Qc": '"', "Bc": "]", "Brc": "}", "Ac": "⟩"}
_MDOC_FLAGGED = frozenset({"Bl", "Bd", "Bf", "Ex", "Rv", "An", "St", "Bk", "Lb", "Db", "Sm"})
_PUNCTUATION = frozenset({".", ",", ";", ":", ")", "]", "?", "!", "}"})


class Mdoc:
    """The mdoc macros of one page, written into ``page``, their arguments'
    escapes read by ``render``."""

    def __init__(self, page: PageText, render: Callable[[str], str]) -> None:
        self.page, self.render = page, render
        self.name = ""  # the page's name, .Nm's first argument: what a bare .Nm says
        self.lists: list[str] = []  # the open .Bl lists' kinds ("-bullet", "-tag", ...), innermost last
        self.enum: list[int] = []  # each open list's last item number (an -enum list's)

    def macro(self, name: str, args: list[str]) -> None:
        """Read the mdoc macro ``name`` (one of ``MDOC_MACROS``) with its ``args``."""
        page = self.page
        if name == "Dt":
            if args:
                page.title = f"{args[0]}({args[1]})" if len(args) > 1 else args[0]
        elif name in ("Sh", "Ss"):
            page.section(1 if name == "Sh" else 2, squash(self.render(self.words(args))))
        elif name in ("Pp", "Lp"):
            if self.lists:
                page.blank()  # a paragraph more of the list's item
            else:
                page.start_paragraph()
        elif name == "Nd":
            page.add("- " + self.words(args))
        elif name == "Bl":
            page.indent()
            kind = next((a for a in args if a.startswith("-") and a not in ("-compact", "-offset", "-width")), "-tag")
            self.lists.append(kind)
            self.enum.append(0)
        elif name == "El":
            page.settle()
            page.outdent()
            if self.lists:
                self.lists.pop()
                self.enum.pop()
        elif name == "It":
            self._item(args)
        elif name == "Bd":
            page.set_no_fill("-literal" in args or "-unfilled" in args)
        elif name == "Ed":
            page.set_no_fill(False)
        elif name in ("D1", "Dl"):
            page.set_no_fill(name == "Dl")
            page.add(self.words(args))
            page.set_no_fill(False)
        elif name in ("Rs", "Re"):
            page.flush()
        elif name in ("Dd", "Os", "Bk", "Ek", "Bf", "Ef", "Sm", "Db", "Ud", "Ed"):
            pass
        else:
            words = self.words([name, *args])
            if words:
                page.add(words)

    def _item(self, args: list[str]) -> None:
        """``.It``: an item of the innermost list, as its kind says."""
        page = self.page
        kind = self.lists[-1] if self.lists else "-tag"
        if kind in ("-bullet", "-dash", "-hyphen", "-enum", "-item"):
            if kind == "-enum":
                self.enum[-1] += 1
            number = f"{self.enum[-1] if self.enum else 1}."
            marker = {"-bullet": "•", "-dash": "-", "-hyphen": "-", "-item": ""}.get(kind, number)
            page.set_item(page.new_item("item", marker))
            words = self.words(args)
            if words:
                page.add(words)
        elif kind == "-column":
            page.set_item(page.new_item("item"))
            cells = " ".join(args).replace("\t", " Ta ")
            page.add(" | ".join(w for w in (self.words(macro_args(c)) for c in cells.split(" Ta ")) if w))
        else:
            item = page.new_item("definition")
            page.set_item(item)
            page.term(item, self.words(args))

    def words(self, tokens: list[str]) -> str:
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
            if token in MDOC_MACROS:
                if token == "Ns":
                    glue = True
                elif token == "Fl":
                    flag = True
                    if following is None or following in MDOC_MACROS or following in _PUNCTUATION:
                        out.append(("" if glue or not out else " ") + "-")
                        flag, glue = False, False
                elif token == "Xr" and following is not None and following not in MDOC_MACROS:
                    section = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in MDOC_MACROS else ""
                    word = self.render(following) + (f"({self.render(section)})" if section else "")
                    out.append(("" if glue or not out else " ") + word)
                    i += 2 if section else 1
                    glue = False
                elif token == "Nm" and (following is None or following in MDOC_MACROS or following in _PUNCTUATION):
                    out.append(("" if glue or not out else " ") + self.name)
                    glue = False
                elif token == "Nm" and not self.name and following is not None:
                    self.name = self.render(following)
                elif token in _MDOC_OPEN:
                    opener, closer = _MDOC_OPEN[token]
                    out.append(("" if glue or not out else " ") + opener)
                    glue = True
                    if closer:
                        closers.append(closer)
                elif token in _MDOC_CLOSE:
                    out.append(_MDOC_CLOSE[token])
                elif token == "Pf" and following is not None:
                    out.append(("" if glue or not out else " ") + self.render(following))
                    i += 1
                    glue = True
                continue
            if skip_flags and token.startswith("-"):
                continue
            word = self.render(token)
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
        return squash("".join(out))
