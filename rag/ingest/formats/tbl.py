"""tbl tables in a man page (``.TS`` to ``.TE``) read as rows of text: a
row a line, each body row kept beside its header.

The table's options line gives its tab character (``tab(;)``); its format
lines end at the first ending in ".". A row's cells are split on the tab,
a ``T{`` ... ``T}`` block is one cell over several lines, rules (``_``,
``=``) and spanned cells (``^``, ``\\^``, ``\\Rx``) are empty cells, and
requests inside the table (``.sp``, ``.ft``, comments) show nothing; a
``.T&`` format change is skipped. The header is the first row when a rule
stands under it or the format sets it (and only it) in bold.

Does not: lay a table out (widths, alignment, spans) or read eqn in it.
"""

from __future__ import annotations

import re
from typing import Callable

from .document import check_text
from .roff import Cursor, squash, strip_comment
from .tables import header_text


def table_rows(cursor: Cursor, render: Callable[[str], str], block_line: Callable[[str], str],
               written: int, max_chars: int) -> list[str]:
    """The rows of the table whose ``.TS`` was just read from ``cursor``,
    each as one line of text, read through its ``.TE``: with a header, the
    header row as "A | B" and each body row as "A: x; B: y"; without, a
    row's cells joined " | ". A cell's text is ``render``'s (squashed); a
    ``T{`` block's is its lines', each ``block_line``'s. TextOverLimit as
    soon as ``written`` characters and the rows pass ``max_chars``.

    A table of "Name;Port" over a rule over "VNC;5900" -> ``["Name | Port", "Name: VNC; Port: 5900"]``
    """
    raw = []
    while (line := cursor.next()) is not None and not re.match(r"[.']\s*TE\b", line):
        raw.append(line)
    tab, formats, at = _layout(raw)
    rows, rules = _data(Cursor(raw[at:]), tab, render, block_line)
    if not rows:
        return []
    specs = [r for r in re.split(r"[,\n]", "\n".join(formats).rstrip().rstrip(".")) if r.strip()]
    header = len(rows) > 1 and (1 in rules or _bold(specs))
    lines, size = [], written
    for k, cells in enumerate(rows):
        lines.append(header_text(cells) if header and not k else _row(rows[0], cells) if header
                     else " | ".join(c for c in cells if c))
        size += len(lines[-1]) + 1
        check_text(size, max_chars)  # each row says its header again: refused as it grows
    return lines


def _layout(raw: list[str]) -> tuple[str, list[str], int]:
    """``(tab character, format lines, where the data starts)`` of a table's lines."""
    tab, at = "\t", 0
    while at < len(raw) and re.match(r"[.']\s*\\\"", raw[at]):
        at += 1
    if at < len(raw) and strip_comment(raw[at]).rstrip().endswith(";"):
        m = re.search(r"tab\s*\((.)\)", raw[at])
        tab = m.group(1) if m else tab
        at += 1
    formats = []
    while at < len(raw):
        line = strip_comment(raw[at])
        at += 1
        formats.append(line)
        if line.rstrip().endswith("."):
            break
    return tab, formats, at


def _data(data: Cursor, tab: str, render: Callable[[str], str],
          block_line: Callable[[str], str]) -> tuple[list[list[str]], set[int]]:
    """The table's rows (as their cells; rows with no text left out) and
    where its rules stand (the number of rows above each)."""
    rows: list[list[str]] = []
    rules: set[int] = set()
    while (line := data.next()) is not None:
        if line.startswith(".T&"):
            while (spec := data.next()) is not None and not strip_comment(spec).rstrip().endswith("."):
                pass
            continue
        if line[:1] in (".", "'"):
            continue  # a request inside the table (.sp, .ft, a comment): nothing to show
        if line.strip() in ("_", "=", "\\_"):
            rules.add(len(rows))
            continue
        cells = _cells(line, tab, data, render, block_line)
        if any(cells):
            rows.append(cells)
    return rows, rules


def _cells(line: str, tab: str, data: Cursor, render: Callable[[str], str],
           block_line: Callable[[str], str]) -> list[str]:
    """A data line's cells, a ``T{`` block's lines read on from ``data``."""
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
                block.append(block_line(more))
            cells.append(squash(" ".join(block)))
        elif cell.strip() in ("_", "=", "\\_", "\\^", "^") or re.fullmatch(r"\s*\\R.\s*", cell):
            cells.append("")
        else:
            cells.append(squash(render(cell)))
    return cells


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
