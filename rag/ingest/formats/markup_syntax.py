"""The line syntax the markup dialects share: underlines, code fences and
list items, and what a heading, a term or a table's header reads as once
its inline markup is dropped (:func:`clean_heading`).

Does not: find titles (``markup_titles``) or units (``markup_reader``).
"""

from __future__ import annotations

import re

UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>:._])\1{2,}[ \t]*")
FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")
# :mod:`bisect` -> bisect; a role's name is one or two words (":py:func:"), so a run of colons costs a step each.
_ROLE = re.compile(r":(?:[\w.+-]+:){1,2}`([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`_{0,2}|\*\*(.+?)\*\*|\*(.+?)\*")
# A heading (or a term, or a signature) is cut to this many characters before
# it is cleaned: the patterns above backtrack quadratically over a long enough
# line, and a chunk's context keeps far fewer (MAX_CONTEXT_CHARS).
MAX_HEADING_CHARS = 1000
ITEM = re.compile(r"[ \t]*(?:[-*+\u2022]|\d{1,3}[.)]|#\.)[ \t]+\S")


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


def table_header(rows: list[list[str]]) -> str:
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
