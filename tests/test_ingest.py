"""Ingest with the real embedder, FAISS and SQLite: incremental, atomic, robust."""

from __future__ import annotations

import os

import pytest

from rag.ingest.chunking import Chunker, ChunkerSettings
from rag.ingest import find_files, ingest
from rag.index.store import FolderIndex, FolderWriter, embedded_text
from tests.conftest import write_corpus
from tests.support.samples import make_pdf


@pytest.fixture
def chunker(embedder):
    return Chunker(embedder.count_tokens, ChunkerSettings(chunk_tokens=64, overlap_tokens=8))


def _search(index_location, embedder, query, k=3):
    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    try:
        return index.search(embedder.embed([query])[0], k)
    finally:
        index.close()


def test_reingest_skips_updates_removes_and_adds(tmp_path, corpus, embedder, chunker):
    index_location = tmp_path / "index"
    first = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert first.counts() == {"added": 4, "updated": 0, "removed": 0, "skipped": 0, "failed": 0}
    assert sorted(first.added) == ["decode.txt", "guide/cooking.rst", "guide/garden.html", "prefill.md"]

    again = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert again.counts() == {"added": 0, "updated": 0, "removed": 0, "skipped": 4, "failed": 0}

    (corpus / "decode.txt").write_text("Decode speed is set by how fast the machine streams its weights from memory.")
    (corpus / "guide" / "cooking.rst").unlink()
    (corpus / "guide" / "bikes.md").write_text("Oil the bicycle chain every few hundred kilometres.")
    third = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert third.counts() == {"added": 1, "updated": 1, "removed": 1, "skipped": 2, "failed": 0}
    assert (third.added, third.updated, third.removed) == (["guide/bikes.md"], ["decode.txt"], ["guide/cooking.rst"])

    assert _search(index_location, embedder, "how do I bake bread?", k=5)[0].source != "guide/cooking.rst"
    top = _search(index_location, embedder, "what sets decode speed?", k=1)[0]
    assert top.source == "decode.txt" and "streams its weights" in top.text
    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    assert index.stats()["files"] == 4 and len(index) == index.stats()["chunks"]
    index.close()


def test_sources_are_relative_and_html_scripts_are_not_indexed(tmp_path, corpus, embedder, chunker):
    index_location = tmp_path / "index"
    ingest(index_location, [corpus, corpus / "prefill.md"], embedder=embedder, chunker=chunker)
    hits = _search(index_location, embedder, "tomatoes in the garden", k=1)
    assert hits[0].source == "guide/garden.html"
    assert "do not index me" not in hits[0].text and "color" not in hits[0].text
    single = tmp_path / "single"
    ingest(single, [corpus / "guide" / "cooking.rst"], embedder=embedder, chunker=chunker)
    assert _search(single, embedder, "bread", k=1)[0].source == "cooking.rst"


def test_a_failure_halfway_leaves_the_old_index_answering(tmp_path, corpus, embedder, chunker, monkeypatch):
    index_location = tmp_path / "index"
    ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    before = [h.chunk_id for h in _search(index_location, embedder, "bread", k=4)]

    (corpus / "guide" / "cooking.rst").write_text("Bread is now about sourdough starters only.")
    (corpus / "decode.txt").unlink()
    (corpus / "new.md").write_text("A brand new file about sailing boats.")
    real_add = FolderWriter.add_file
    calls = {"n": 0}

    def crash_on_second(self, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-ingest
        return real_add(self, **kwargs)

    monkeypatch.setattr(FolderWriter, "add_file", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert calls["n"] == 2
    assert [h.chunk_id for h in _search(index_location, embedder, "bread", k=4)] == before
    assert "sailing" not in " ".join(h.text for h in _search(index_location, embedder, "sailing boats", k=4))
    assert len(list(index_location.glob("gen-*"))) == 1

    monkeypatch.setattr(FolderWriter, "add_file", real_add)
    report = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert report.counts()["added"] == 1 and report.counts()["updated"] == 1 and report.counts()["removed"] == 1


def test_bad_files_are_reported_and_the_rest_are_indexed(tmp_path, embedder, chunker):
    files = {
        "good.md": "Good text about owls, which hunt at night.",
        "empty.txt": "",
        "latin1.txt": "caf\xe9 au lait".encode("latin-1"),
        "binary.txt": b"\x00\x01\x02binary\x00",
        "broken.pdf": b"%PDF-1.7\n1 0 obj <<",
        "paged.pdf": make_pdf(["Page one is about foxes.", "Page two is about badgers."]),
    }
    root = write_corpus(tmp_path / "docs", files)
    os.symlink(root / "vanished.md", root / "dangling.md")
    report = ingest(tmp_path / "index", [root, tmp_path / "nope"], embedder=embedder, chunker=chunker)
    failed = dict(report.failed)
    assert sorted(report.added) == ["good.md", "paged.pdf"]
    assert set(failed) == {"empty.txt", "latin1.txt", "binary.txt", "broken.pdf", "dangling.md", str(tmp_path / "nope")}
    assert "not UTF-8" in failed["latin1.txt"] and "binary" in failed["binary.txt"]
    assert "cannot read" in failed["dangling.md"] and "no such file" in failed[str(tmp_path / "nope")]
    hit = _search(tmp_path / "index", embedder, "badgers", k=1)[0]
    assert (hit.source, hit.page) == ("paged.pdf", 2)


def test_include_and_exclude_globs(corpus):
    found = find_files([corpus], include=["*.md", "*.html"], exclude=["guide/*.html"])
    assert [f.source for f in found.files] == ["prefill.md"]
    found = find_files([corpus], exclude=["guide/*"])
    assert sorted(f.source for f in found.files) == ["decode.txt", "prefill.md"]
    (corpus / ".hidden.md").write_text("secret")
    (corpus / ".git").mkdir()
    (corpus / ".git" / "notes.md").write_text("internal")
    (corpus / "photo.png").write_bytes(b"\x89PNG")
    sources = {f.source for f in find_files([corpus]).files}
    assert ".hidden.md" not in sources and ".git/notes.md" not in sources and "photo.png" not in sources


def test_an_edited_file_embeds_only_its_changed_chunks(tmp_path, embedder, chunker):
    paragraphs = [f"Paragraph {i} is about topic number {i}, with words enough to stand alone. " * 3 for i in range(6)]
    corpus = write_corpus(tmp_path / "corpus", {"long.md": "\n\n".join(paragraphs)})
    index_location = tmp_path / "index"
    first = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert first.chunks_added >= 3 and first.chunks_embedded == first.chunks_added
    paragraphs[-1] = "The last paragraph now talks about sailing boats and harbour tides instead. " * 3
    (corpus / "long.md").write_text("\n\n".join(paragraphs))
    second = ingest(index_location, [corpus], embedder=embedder, chunker=chunker)
    assert second.updated == ["long.md"] and second.chunks_added == first.chunks_added
    assert 1 <= second.chunks_embedded < second.chunks_added
    # A reused vector is the one the text would get anyway.
    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    stored = index.chunks()
    fresh = embedder.embed([embedded_text(context, text) for _, _, text, _, context in stored])
    for (_, _, _, vector, _), expected in zip(stored, fresh):
        assert float(vector @ expected) == pytest.approx(1.0, abs=1e-4)
    assert _search(index_location, embedder, "sailing boats and tides", k=1)[0].text.startswith("The last paragraph")
    index.close()
