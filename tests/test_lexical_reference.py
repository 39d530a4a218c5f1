"""The incremental BM25 index against bm25s, the reference implementation:
the same scores for the same corpus, and an updated index equal to one
built from scratch."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rag.index.lexical import LexicalIndex, tokenize

WORDS = ("prefill decode cache token prompt llama budget os.path.join shutil.copytree SIGINT http_proxy "
         "asyncio queue thread lock gzip bread oven yeast").split()


def _corpus(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def _scores(index: LexicalIndex, query: str) -> dict[int, float]:
    return dict(index.search(query, len(index)))


def test_scores_match_bm25s():
    bm25s = pytest.importorskip("bm25s")
    rng = random.Random(3)
    texts = _corpus(rng, 300)
    ours = LexicalIndex.build(list(range(300)), texts)
    reference = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    reference.index([tokenize(t) for t in texts], show_progress=False)
    for query in ("prefill cache", "os.path.join", "SIGINT in a thread", "bread bread oven", "nothing here"):
        terms = [t for t in tokenize(query) if t in reference.vocab_dict]
        expected = reference.get_scores(terms) if terms else np.zeros(300)
        got = _scores(ours, query)
        for doc in range(300):
            assert got.get(doc, 0.0) == pytest.approx(float(expected[doc]), rel=1e-4, abs=1e-5), (query, doc)


def test_an_updated_index_equals_one_built_from_scratch(tmp_path):
    rng = random.Random(4)
    texts = _corpus(rng, 200)
    base = LexicalIndex.build(list(range(200)), texts)
    base.save(tmp_path / "bm25")
    removed = rng.sample(range(200), 40)
    added = {200 + i: t for i, t in enumerate(_corpus(rng, 25))}
    updated = LexicalIndex.load(tmp_path / "bm25").updated(removed, list(added), list(added.values()))
    kept = {i: t for i, t in enumerate(texts) if i not in removed} | added
    fresh = LexicalIndex.build(list(kept), list(kept.values()))
    assert len(updated) == len(fresh) == 185
    for query in ("prefill cache", "shutil copytree", "yeast oven token"):
        a, b = _scores(updated, query), _scores(fresh, query)
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k]) for k in a)
