"""Chunks are sized in the embedding model's tokens and map back to the text."""

from __future__ import annotations

import pytest

from rag.ingest.chunking import Chunker, ChunkerSettings
from rag.ingest.formats import LoadedDocument


def test_chunks_fit_their_token_size_and_spans_map_back(embedder):
    text = "\n\n".join(
        f"Paragraph {i}. " + " ".join(f"word{i}_{j} ünïcode" for j in range(40)) for i in range(12)
    )
    doc = LoadedDocument.paged(text, ((1, 0), (2, len(text) // 2)))
    chunker = Chunker(embedder.count_tokens, ChunkerSettings(chunk_tokens=64, overlap_tokens=8))
    chunks = chunker.split(doc)
    assert len(chunks) > 5
    for c in chunks:
        assert c.n_tokens == embedder.count_tokens(c.text) <= 64
        assert text[c.start : c.end] == c.text
        assert c.page == (1 if c.start < len(text) // 2 else 2)
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)
    assert not any(c.start < len(text) // 2 < c.end for c in chunks)  # no chunk spans two pages
    covered = set()
    for c in chunks:
        covered.update(range(c.start, c.end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())


@pytest.mark.parametrize("size, overlap", [(8, 0), (100, 100), (100, -1)])
def test_bad_chunk_settings_are_refused(size, overlap):
    with pytest.raises(ValueError):
        ChunkerSettings(size, overlap)
