"""The index on disk: FAISS against brute force, manifests, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.errors import IndexBusy, IndexMismatch, IndexNotFound
from rag.index.manifest import FORMAT_VERSION, Manifest
from rag.index.store import FolderIndex, NewChunk, open_writer

DIM = 16
MANIFEST = Manifest(embedder="test-embedder", dim=DIM, chunker={"chunk_tokens": 100, "overlap_tokens": 10})


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _add(writer, source: str, vectors: np.ndarray) -> None:
    chunks = [NewChunk(f"{source}-{i}", i, i * 10, i * 10 + 5, None, 5, f"{source} chunk {i}") for i in range(len(vectors))]
    writer.add_file(root="/r", source=source, path=f"/r/{source}", sha256="h" + source, size=1, chunks=chunks, vectors=vectors)


def _open(directory) -> FolderIndex:
    return FolderIndex.open(directory, embedder=MANIFEST.embedder, dim=DIM)


def test_search_matches_brute_force_cosine(tmp_path):
    rng = np.random.default_rng(0)
    vectors = _unit(rng.normal(size=(60, DIM)))
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "a.txt", vectors[:30])
        _add(w, "b.txt", vectors[30:])
        w.commit()
    index = _open(tmp_path)
    texts = [f"a.txt chunk {i}" for i in range(30)] + [f"b.txt chunk {i}" for i in range(30)]
    for q in _unit(rng.normal(size=(5, DIM))):
        expected = np.argsort(-(vectors @ q))[:7]
        hits = index.search(q, 7)
        assert [h.text for h in hits] == [texts[i] for i in expected]
        assert [h.score for h in hits] == pytest.approx([float(vectors[i] @ q) for i in expected], abs=1e-5)


def test_removing_a_file_removes_its_vectors(tmp_path):
    vectors = _unit(np.eye(DIM)[:4] + 0.01)
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "a.txt", vectors[:2])
        _add(w, "b.txt", vectors[2:])
        w.commit()
    with open_writer(tmp_path, MANIFEST) as w:
        w.remove_file(w.files()[("/r", "a.txt")].id)
        w.commit()
    index = _open(tmp_path)
    assert len(index) == 2
    assert {h.source for h in index.search(vectors[0], 4)} == {"b.txt"}


def test_an_interrupted_write_leaves_the_previous_index(tmp_path):
    vectors = _unit(np.ones((2, DIM)))
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "a.txt", vectors)
        w.commit()
    with pytest.raises(RuntimeError):
        with open_writer(tmp_path, MANIFEST) as w:
            w.remove_file(w.files()[("/r", "a.txt")].id)
            _add(w, "b.txt", vectors)
            raise RuntimeError("crash halfway")
    index = _open(tmp_path)
    assert {h.source for h in index.search(vectors[0], 5)} == {"a.txt"}
    assert len(list(tmp_path.glob("gen-*"))) == 1  # the staged copy was discarded


def test_a_write_without_commit_publishes_nothing(tmp_path):
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "a.txt", _unit(np.ones((1, DIM))))
    with pytest.raises(IndexNotFound):
        _open(tmp_path)


def test_another_embedder_or_format_is_refused_with_advice(tmp_path):
    with open_writer(tmp_path, MANIFEST) as w:
        w.commit()
    with pytest.raises(IndexMismatch, match="rebuild"):
        FolderIndex.open(tmp_path, embedder="other-model", dim=DIM)
    manifest_path = next(tmp_path.glob("gen-*/manifest.json"))
    raw = json.loads(manifest_path.read_text())
    raw["format_version"] = FORMAT_VERSION + 1
    manifest_path.write_text(json.dumps(raw))
    with pytest.raises(IndexMismatch, match="format version"):
        _open(tmp_path)
    with pytest.raises(IndexMismatch):
        with open_writer(tmp_path, MANIFEST):
            pass


def test_one_writer_at_a_time(tmp_path):
    with open_writer(tmp_path, MANIFEST):
        with pytest.raises(IndexBusy):
            with open_writer(tmp_path, MANIFEST):
                pass


def test_missing_index_says_how_to_build_one(tmp_path):
    with pytest.raises(IndexNotFound, match="rag ingest"):
        _open(tmp_path / "nowhere")
