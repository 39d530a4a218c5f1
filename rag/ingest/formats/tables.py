"""Table rows as text that keeps each value beside its column header, so a
chunk holding any rows still says what each value means.

Does not: read any file format.
"""

from __future__ import annotations

import datetime as dt
from typing import Sequence

CELL_CHARS = 500  # a cell longer than this is cut: one cell must not fill a chunk


def cell_text(value: object) -> str:
    """A cell's value as text: whole floats without ``.0``, dates as ISO.

    ``cell_text(3.0) -> "3"``; ``cell_text(None) -> ""``
    """
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    elif isinstance(value, dt.datetime) and value.time() == dt.time():
        value = value.date()
    if isinstance(value, (dt.date, dt.time)):
        text = value.isoformat()
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def header_text(headers: Sequence[str]) -> str:
    """The header row as one line: ``"Region | Units"``."""
    return " | ".join(h for h in headers if h)


def row_text(headers: Sequence[str], cells: Sequence[str]) -> str:
    """A row as ``header: value`` pairs, empty cells left out; a cell
    beyond the headers (or under an empty one) is given its column number.

    ``row_text(["City", "Pop"], ["Oslo", "700k"]) -> "City: Oslo; Pop: 700k"``
    """
    pairs = []
    for i, cell in enumerate(cells):
        if not cell:
            continue
        name = headers[i] if i < len(headers) and headers[i] else f"column {i + 1}"
        pairs.append(f"{name}: {cell}")
    return "; ".join(pairs)
