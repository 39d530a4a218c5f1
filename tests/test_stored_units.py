"""A document's units as its reader found them, cut into chunks and kept
with each (issue 54): pure logic over the chunker with a word-count
tokenizer; the stores' round trip is in test_index_contract."""

from __future__ import annotations

from rag.index.records import stored_units, units_json
from rag.ingest.chunking import Chunker, ChunkerSettings
from rag.ingest.formats import LoadedDocument, Unit, load_document
from rag.ingest.formats.document import units_within

TEXT = "Alpha beta gamma. Delta epsilon.\n\nZeta eta theta iota kappa lambda."


def test_units_within_cuts_at_the_chunk_and_restates_offsets():
    units = (Unit(0, 17, "text", "H"), Unit(18, 32, "text", "H"), Unit(34, 66, "definition", "term"))
    assert units_within(units, TEXT, 0, len(TEXT)) == units
    inner = units_within(units, TEXT, 6, 45)
    assert [TEXT[6:45][u.start:u.end] for u in inner] == ["beta gamma.", "Delta epsilon.", "Zeta eta th"]
    assert inner[-1].about == "term" and inner[-1].kind == "definition"
    assert units_within(units, TEXT, 17, 18) == ()  # whitespace alone is no unit
    assert units_within((), TEXT, 0, 10) == ()


def test_stored_units_round_trip_and_refuse_what_is_not_a_unit():
    units = (Unit(0, 5, "row", "Größe: 5"), Unit(6, 9))
    assert stored_units(units_json(units)) == units
    assert stored_units("not json") == () and stored_units(None) == () and stored_units('{"a": 1}') == ()
    assert stored_units('[[0, 5, "text", "a"], [1, "x", "text", ""], [true, 2, "text", ""], [3, 2, "t", ""]]') == \
        (Unit(0, 5, "text", "a"),)


def test_every_chunk_carries_the_units_that_lie_in_it():
    words = lambda text: len(text.split())  # noqa: E731 - a tokenizer of words, for a pure test
    text = "\n\n".join(f"Sentence number {i} says a thing. And another one {i} here." for i in range(40))
    document = load_document("notes.md", ".md", ("# Notes\n\n" + text).encode())
    chunks = Chunker(words, ChunkerSettings(chunk_tokens=30, overlap_tokens=5)).split(document)
    assert len(chunks) > 5
    for chunk in chunks:
        assert chunk.units, chunk.text
        for unit in chunk.units:
            shown = chunk.text[unit.start:unit.end]
            assert shown == shown.strip() and shown in document.text
            assert unit.about == ("" if unit.kind == "heading" else "Notes")  # a heading: about the one above
    # Every sentence of the document is a whole unit of some chunk.
    whole = {chunk.text[u.start:u.end] for chunk in chunks for u in chunk.units}
    assert {document.text[u.start:u.end] for u in document.units if u.kind == "text"} <= whole


def test_a_document_without_units_gets_sentences_under_their_headings():
    loaded = LoadedDocument("Title\n\nOne. Two e.g. three.", headings=((0, 1, "Title"),))
    assert loaded.units == ()  # a reader's own; load_document fills them in
    document = load_document("t.md", ".md", b"Title\n=====\n\nOne. Two e.g. three.\n")
    assert [(document.text[u.start:u.end], u.kind, u.about) for u in document.units][-2:] == \
        [("One.", "text", "Title"), ("Two e.g. three.", "text", "Title")]
