"""Glob matching in time linear in the name: ``*`` and ``?`` within a name,
``**`` across folders (``**/`` also matches none), ``[...]`` character
sets, case-insensitively, over ``/``-separated paths.

A glob is run as a set of positions in it (a bit per position, held in one
integer) that advances one character at a time, so a pattern such as
``*a*a*a*a*a*a*b`` costs the same as ``*b``: a backtracking regular
expression takes time exponential in its number of stars, holding the
interpreter lock all along (issue 27).

Does not: walk folders or decide which globs apply (``rag.ingest.files``
and ``rag.retrieval.scope`` do).
"""

from __future__ import annotations

import re
from functools import lru_cache

# Token kinds. A token at position i either consumes one character and moves
# on (LIT, ONE, SET), loops on characters (STAR within a name, ANY across
# folders), or is the empty-or-"anything ending in /" group of "**/" (OPT,
# which is followed by ANY and a literal "/").
LIT, ONE, SET, STAR, ANY, OPT = range(6)


class Glob:
    """One compiled glob; ``match(path)`` says whether it matches the whole path."""

    def __init__(self, glob: str) -> None:
        self.glob = glob
        tokens = _tokens(glob)
        self.size = len(tokens)
        self._tokens = tokens
        self._stay_any = self._stay_name = self._skip1 = self._skip3 = 0
        for i, (kind, _) in enumerate(tokens):
            bit = 1 << i
            if kind == ANY:
                self._stay_any |= bit
                self._skip1 |= bit
            elif kind == STAR:
                self._stay_name |= bit
                self._skip1 |= bit
            elif kind == OPT:
                self._skip1 |= bit  # into the group
                self._skip3 |= bit  # over it: OPT, ANY, "/"
        self._advance: dict[str, int] = {}  # character -> positions that consume it and move on

    def _closure(self, states: int) -> int:
        # Runs of skippable tokens are short (adjacent stars are merged), so this settles in a few rounds.
        while True:
            grown = states | ((states & self._skip1) << 1) | ((states & self._skip3) << 3)
            if grown == states:
                return states
            states = grown

    def _advancing(self, char: str) -> int:
        mask = self._advance.get(char)
        if mask is None:
            mask, low = 0, char.lower()
            for i, (kind, arg) in enumerate(self._tokens):
                if (kind == LIT and arg == low) or (kind == ONE and char != "/") or \
                        (kind == SET and arg.match(char)):
                    mask |= 1 << i
            if len(self._advance) < 4096:  # bounded: names may hold any characters
                self._advance[char] = mask
        return mask

    def match(self, path: str) -> bool:
        """Whether the glob matches all of ``path``, in time linear in its length.

        ``Glob("*a*a*a*b").match("a" * 5000) -> False`` (at once)
        """
        states = self._closure(1)
        for char in path:
            stay = self._stay_any | (self._stay_name if char != "/" else 0)
            states = self._closure(((states & self._advancing(char)) << 1) | (states & stay))
            if not states:
                return False
        return bool(states >> self.size & 1)


def _tokens(glob: str) -> list[tuple[int, object]]:
    """``glob`` as tokens, adjacent stars merged; ValueError for a bad set."""
    out: list[tuple[int, object]] = []

    def add(kind: int, arg: object = None) -> None:
        # "**" next to "*" (either order) is one "**"; "*" next to "*" is one "*".
        if kind in (STAR, ANY) and out and out[-1][0] in (STAR, ANY):
            if kind == ANY:
                out[-1] = (ANY, None)
            return
        out.append((kind, arg))

    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.extend([(OPT, None), (ANY, None), (LIT, "/")])
            i += 3
        elif glob.startswith("**", i):
            add(ANY)
            i += 2
        elif glob[i] == "*":
            add(STAR)
            i += 1
        elif glob[i] == "?":
            add(ONE)
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            j = glob.index("]", i + 2) if glob[i + 1] == "]" else glob.index("]", i + 1)
            body = glob[i + 1:j].replace("\\", "\\\\")
            body = "^" + body[1:] if body.startswith("!") else body
            try:
                out.append((SET, re.compile("[" + body + "]", re.IGNORECASE | re.DOTALL)))
            except re.error as exc:
                raise ValueError(f"{glob!r} is not a usable glob: bad set [{glob[i + 1:j]}] ({exc})") from None
            i = j + 1
        else:
            out.append((LIT, glob[i].lower()))
            i += 1
    return out


@lru_cache(maxsize=256)
def compile_glob(glob: str) -> Glob:
    """``glob`` compiled (cached); ValueError if it holds a bad ``[...]`` set."""
    return Glob(glob)
