"""roff's escapes read as text, as nroff would print them: special
characters (``\\(em``, ``\\[u00E9]``, ``\\['e]``, ``\\N'233'``) and the page's
strings (``\\*(Tm``) put in; fonts, sizes, motions and the other escapes
that print nothing dropped, with their arguments.

Does not: read the page's lines or requests (see ``roff``), or lay text out.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Mapping

from .document import check_text

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


def render_escapes(s: str, strings: Mapping[str, str], max_chars: int, depth: int = 0) -> str:
    """Text with its escapes read: fonts and sizes dropped, special
    characters and ``strings`` put in (a string's own escapes read too, to a
    bounded depth), unknown escapes dropped. TextOverLimit as soon as the
    strings put in pass ``max_chars``.

    ``render_escapes("\\\\fBls\\\\fR \\\\(em list", {}, 100) -> "ls — list"``
    """
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
            value = strings.get(name.split(" ")[0], "") if depth < 8 else ""
            piece = render_escapes(value, strings, max_chars, depth + 1)
            size += len(piece)
            check_text(size, max_chars)
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
