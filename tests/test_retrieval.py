"""Hybrid retrieval: rank fusion, the query cache, BM25 on disk, and the
store's switch from exact to approximate search."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.index import vectors as vector_kinds
from rag.errors import RagError
from rag.index.lexical import LexicalIndex, tokenize
from rag.retrieval import QueryCache, check_mode, reciprocal_rank_fusion
from rag.index.manifest import Manifest
from rag.index.store import LEXICAL_FOLDER, FolderIndex, NewChunk, open_writer

DIM = 16
MANIFEST = Manifest(embedder="test-embedder", dim=DIM, chunker={"chunk_tokens": 100, "overlap_tokens": 10})


def test_fusion_rewards_agreement_between_rankings():
    fused = reciprocal_rank_fusion([[7, 3, 5], [3, 9]], k=5)
    assert [item for item, _ in fused] == [3, 7, 9, 5]
    assert fused[0][1] == pytest.approx(1 / 7 + 1 / 6)


def test_fusion_of_one_ranking_keeps_its_order():
    assert [i for i, _ in reciprocal_rank_fusion([[4, 2, 8]])] == [4, 2, 8]
    assert reciprocal_rank_fusion([[], []]) == []


def test_query_cache_embeds_each_query_once_and_evicts_the_oldest():
    calls = []

    def embed(texts):
        calls.extend(texts)
        return np.ones((len(texts), 3), dtype=np.float32) * len(calls)

    cache = QueryCache(embed, size=2)
    first = cache.vector("a")
    assert cache.vector("a") is first and calls == ["a"]
    cache.vector("b")
    cache.vector("c")  # evicts "a"
    cache.vector("a")
    assert calls == ["a", "b", "c", "a"] and (cache.hits, cache.misses) == (1, 4)
    with pytest.raises(ValueError):
        first[0] = 5  # a cached vector cannot be changed under a later caller
    cache.vector("a", "acme")  # asked in another collection: embedded again, its speed tells nothing of the other
    assert calls[-1] == "a" and cache.misses == 5


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(RagError, match="hybrid, dense|dense, bm25"):
        check_mode("sparse")


def test_tokenize_keeps_identifiers_whole_and_in_parts():
    assert tokenize("How do I use os.path.join?") == ["use", "os.path.join", "os", "path", "join"]
    assert "http_proxy" in tokenize("HTTP_PROXY") and "proxy" in tokenize("HTTP_PROXY")


def test_lexical_index_round_trips_without_pickle(tmp_path):
    texts = ["the gzip module reads compressed files", "sqlite3 opens a database", "gzip and zlib compress"]
    index = LexicalIndex.build([10, 20, 30], texts)
    found = index.search("gzip compressed files", 3)
    assert [i for i, _ in found][:1] == [10] and {i for i, _ in found} == {10, 30}
    assert index.search("nothing matches here", 3) == []
    index.save(tmp_path / "bm25")
    for path in (tmp_path / "bm25").iterdir():
        if path.suffix == ".npy":
            np.load(path, allow_pickle=False)  # raises if anything was pickled
        else:
            json.loads(path.read_text(encoding="utf-8"))
    assert LexicalIndex.load(tmp_path / "bm25").search("gzip compressed files", 3) == found
    (tmp_path / "bm25" / "format.json").write_text("{not json")
    with pytest.raises(ValueError):
        LexicalIndex.load(tmp_path / "bm25")


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _add(writer, source: str, vectors: np.ndarray, words: list[str] | None = None) -> None:
    words = words or [f"{source} chunk {i}" for i in range(len(vectors))]
    chunks = [NewChunk(f"{source}-{i}", i, i, i + 1, None, 5, w) for i, w in enumerate(words)]
    writer.add_file(root="/r", source=source, path=f"/r/{source}", sha256="h" + source, size=1, chunks=chunks, vectors=vectors)


def _open(directory) -> FolderIndex:
    return FolderIndex.open(directory, embedder=MANIFEST.embedder, dim=DIM)


def test_bm25_is_saved_with_each_generation_and_rebuilt_when_missing(tmp_path):
    rng = np.random.default_rng(1)
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "a.txt", _unit(rng.normal(size=(3, DIM))), ["alpha beta", "gamma SIGINT handler", "delta"])
        w.commit()
    index = _open(tmp_path)
    assert (index.generation / LEXICAL_FOLDER).is_dir() and index.stats()["lexical"]
    query = _unit(rng.normal(size=(1, DIM)))[0]
    (found, _), = index.lexical_search("SIGINT", 5)
    hit, = index.hits([found], query)
    assert hit.text == "gamma SIGINT handler"
    # A hit found by BM25 alone is still scored by its cosine to the query.
    assert hit.score == pytest.approx(float(np.dot(index._vectors.reconstruct(found), query)), abs=1e-6)
    # A generation written before BM25 existed: built in memory from the texts.
    import shutil

    shutil.rmtree(index.generation / LEXICAL_FOLDER)
    older = _open(tmp_path)
    assert older.lexical_search("SIGINT", 5)[0][0] == found


def test_store_switches_to_ivf_above_the_threshold_and_back(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_kinds, "APPROXIMATE_FROM", 600)
    rng = np.random.default_rng(2)
    centres = _unit(rng.normal(size=(12, DIM)))
    data = _unit(centres[rng.integers(0, 12, size=800)] + 0.15 * rng.normal(size=(800, DIM)))
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "small.txt", data[:200])
        w.commit()
    assert "exact" in _open(tmp_path).stats()["vector_search"]
    with open_writer(tmp_path, MANIFEST) as w:
        _add(w, "big.txt", data[200:])
        w.commit()
    index = _open(tmp_path)
    assert index.stats()["vector_search"].startswith("approximate: IVF")
    # Approximate, yet it finds nearly all of the exact top 10.
    queries = _unit(data[rng.integers(0, 800, size=20)] + 0.05 * rng.normal(size=(20, DIM)))
    overlap = []
    for q in queries:
        exact = set(np.argsort(-(data @ q))[:10].tolist())
        found = {int(h.chunk_id.split("-")[1]) + (0 if h.source == "small.txt" else 200) for h in index.search(q, 10)}
        overlap.append(len(exact & found) / 10)
    assert np.mean(overlap) >= 0.9
    # Re-ingest removes a file's vectors from the IVF index too; far below
    # the threshold the store is exact again.
    with open_writer(tmp_path, MANIFEST) as w:
        w.remove_file(w.files()[("/r", "big.txt")].id)
        w.commit()
    smaller = _open(tmp_path)
    assert len(smaller) == 200 and "exact" in smaller.stats()["vector_search"]
    assert {h.source for h in smaller.search(data[0], 5)} == {"small.txt"}


def test_pipeline_modes_find_an_exact_term_and_score_by_cosine(pipeline_factory, corpus, tmp_path):
    pipeline = pipeline_factory(tmp_path / "index")
    pipeline.ingest([corpus])
    lexical = pipeline.search("230 degrees Celsius", k=2, mode="bm25")
    assert lexical[0].source == "guide/cooking.rst"
    hybrid = pipeline.search("230 degrees Celsius", k=4, mode="hybrid")
    dense = {h.chunk_id: h.score for h in pipeline.search("230 degrees Celsius", k=4, mode="dense")}
    assert hybrid[0].source == "guide/cooking.rst"
    for h in hybrid:  # the same cosine whichever search found the chunk
        assert h.score == pytest.approx(dense[h.chunk_id], abs=1e-5)
    assert pipeline.components.query_cache.hits >= 2  # one embedding served all three searches
    with pytest.raises(RagError, match="retrieval mode"):
        pipeline.search("bread", mode="keyword")
