"""The records both index stores hold and give back: a retrieved chunk
(``Hit``), an ingested file (``FileRecord``), a chunk to store
(``NewChunk``), and how a chunk's text and location are written for
embedding, BM25 and storage.

Does not: store or read anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..ingest.formats.document import CONTEXT_SEPARATOR, Unit


def embedded_text(context: str, text: str) -> str:
    """What a chunk is embedded as: its context (title and headings) before
    its text. Prompts and sources show the text alone.

    ``embedded_text("bisect > Examples", "x") -> "bisect > Examples\n\nx"``
    """
    return f"{context}\n\n{text}" if context else text


def lexical_text(context: str, text: str) -> str:
    """What a chunk is BM25-indexed as: its document's title (the first part
    of its context) before its text. The section headings are left out of
    BM25: measured on the Python docs, their generic words ("Examples",
    "Classes and functions"), repeated over every chunk of a section, lowered
    BM25's MRR, while the title raised it (README, "Chunks know where they stand").

    ``lexical_text("bisect > Examples", "x") -> "bisect\n\nx"``
    """
    title = context.split(CONTEXT_SEPARATOR, 1)[0]
    return f"{title}\n\n{text}" if title else text


def location_json(location: dict[str, object] | None) -> str | None:
    """A chunk's location as stored (JSON text, None for none)."""
    return json.dumps(location, ensure_ascii=False, sort_keys=True) if location else None


def units_json(units) -> str:
    """A chunk's units as stored: JSON text of ``[start, end, kind, about]`` lists."""
    return json.dumps([u.to_list() for u in units], ensure_ascii=False, separators=(",", ":"))


def stored_units(raw: str | list | None) -> tuple[Unit, ...]:
    """A chunk's units as stored (JSON text; PostgreSQL may give it parsed);
    what cannot be read is none."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return ()
    if not isinstance(raw, list):
        return ()
    return tuple(u for u in map(Unit.from_list, raw) if u is not None)


def stored_location(raw: str | dict | None) -> dict[str, object] | None:
    """A chunk's location as stored (JSON text; PostgreSQL may give it parsed), None for none or unreadable."""
    if isinstance(raw, dict):
        return raw
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk. ``score`` is the cosine similarity to the query;
    ``location`` where it lies in its file (``page``, ``slide``, ``sheet``
    and ``rows``, ``chapter``, ``lines``), ``context`` the title and
    headings above it; ``units`` its document's own units (sentences, items,
    definitions, rows, code lines) as its reader found them at ingest,
    offsets into ``text``, each with what it is about."""

    chunk_id: str
    source: str
    score: float
    text: str
    page: int | None = None
    char_start: int = 0
    char_end: int = 0
    position: int = 0
    location: dict[str, object] | None = None
    context: str = ""
    root: str = ""  # the folder its file was ingested from (with source, names the document)
    lang: str = "en"  # its language, detected at ingest (rag.text.language)
    units: tuple[Unit, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """The result object of the ``rag search --json`` contract."""
        return {
            "chunk_id": self.chunk_id,
            "source": self.source,
            "score": self.score,
            "text": self.text,
            "page": self.page,
            "char_start": self.char_start,
            "char_end": self.char_end,
            "location": self.location,
            "context": self.context,
        }


@dataclass(frozen=True)
class FileRecord:
    """What the index knows about one ingested file."""

    id: int
    root: str
    source: str
    sha256: str
    n_chunks: int


@dataclass(frozen=True)
class NewChunk:
    """A chunk to store, with its vector."""

    chunk_id: str
    position: int
    char_start: int
    char_end: int
    page: int | None
    n_tokens: int
    text: str
    context: str = ""
    location: dict[str, object] | None = None
    lang: str = "en"  # detected at ingest (rag.text.language)
    units: tuple[Unit, ...] = ()  # its document's units within it, offsets into ``text``

    @property
    def lexical(self) -> str:
        """What it is BM25-indexed as."""
        return lexical_text(self.context, self.text)
