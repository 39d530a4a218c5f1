"""The contract every reader's units keep (rag.ingest.formats.document.Unit),
checked by the format tests."""

from __future__ import annotations

from rag.ingest.formats.document import UNIT_KINDS, LoadedDocument


def checked_units(doc: LoadedDocument) -> list[tuple[str, str, str]]:
    """``(kind, text, about)`` of each unit, after checking the contract:
    in order, not overlapping, stripped, inside the text, known kinds."""
    last = 0
    for unit in doc.units:
        assert unit.kind in UNIT_KINDS
        assert last <= unit.start < unit.end <= len(doc.text), unit
        piece = doc.text[unit.start:unit.end]
        assert piece == piece.strip() and any(c.isalnum() for c in piece), unit
        last = unit.end
    return [(u.kind, doc.text[u.start:u.end], u.about) for u in doc.units]
