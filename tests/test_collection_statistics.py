"""Collections keep their statistics to themselves (issue 55): a question's
ranking in one collection (its chunks, their order and their scores) is the
same byte for byte whatever another collection holds, in both stores. BM25's
document frequencies, number of chunks and mean length, and the languages a
question is read in, are the collection's; PostgreSQL, whose rows are live,
keeps a question to its collection in the SQL itself, even for a reader that
read the list of collections before another was committed."""

from __future__ import annotations

import numpy as np
import pytest

from rag.index import postgres
from rag.index.lexical import LexicalIndex
from rag.index.location import open_index
from rag.ingest.run import ingest
from rag.retrieval.search import retrieve
from tests.conftest import write_corpus

STORES = ("folder", "postgresql")
MODES = ("bm25", "hybrid", "dense")
FRENCH = ("Le plafond est la bande passante mémoire, pas le calcul : chaque jeton relit tous les poids du modèle. "
          "Le registre des marques est tenu chaque trimestre par le service comptable de la société. ")

ALPHA = {
    "a.md": "Marker 4682 ledger.\n",
    "b.md": "Marker 9051 ledger.\n",
    "c.md": "Mark every page of the audit before it is filed.\n",
}
# What another collection may hold: the word asked about many times (its document frequency and the mean
# length change), and French (a question read in French too: "marker" is also "mark" there, which c.md holds).
BETA = {
    "numbers.md": "Ledger 4682. " + "4682 " * 60 + "\n",
    "rapport.md": FRENCH * 3,
}
QUESTIONS = ("4682 9051", "marker 9051", "ledger audit")


@pytest.fixture(params=STORES)
def location(request, tmp_path):
    """An empty index location of each store."""
    if request.param == "folder":
        return tmp_path / "index"
    return request.getfixturevalue("pgvector_url")


def _open(location, embedder):
    return open_index(location, embedder=embedder.name, dim=embedder.dim)


def _rankings(location, embedder) -> dict[tuple[str, str], list[tuple]]:
    """Each question's hits in alpha under each mode, as ``(chunk id, source, cosine)``, and its BM25
    ranking as ``(id, source, BM25 score)``, from the index opened afresh."""
    index = _open(location, embedder)
    try:
        found = {}
        for question in QUESTIONS:
            vector = lambda q=question: embedder.embed([q])[0]  # noqa: E731
            for mode in MODES:
                hits = retrieve(index, question, vector, 5, mode, collection="alpha")
                found[question, mode] = [(h.chunk_id, h.source, h.score) for h in hits]
            ranked = index.lexical_search(question, 5, collection="alpha")
            hits = index.hits([i for i, _ in ranked], vector())
            found[question, "scores"] = [(i, h.source, score) for (i, score), h in zip(ranked, hits)]
        return found
    finally:
        index.close()


def test_a_ranking_in_one_collection_is_the_same_whatever_another_holds(location, embedder, chunker, tmp_path):
    ingest(location, [write_corpus(tmp_path / "alpha", ALPHA)], embedder=embedder, chunker=chunker,
           collection="alpha")
    before = _rankings(location, embedder)
    assert [s for _, s, _ in before["4682 9051", "scores"]] == ["a.md", "b.md"]  # tied: by chunk id
    assert {s for _, s, _ in before["marker 9051", "scores"]} == {"a.md", "b.md"}  # read in English only
    ingest(location, [write_corpus(tmp_path / "beta", BETA)], embedder=embedder, chunker=chunker, collection="beta")
    index = _open(location, embedder)
    try:
        assert index.collections() == {"alpha": 3, "beta": 2}
        assert "fr" in index.stats()["languages"]  # the index now holds French: alpha does not
    finally:
        index.close()
    after = _rankings(location, embedder)
    assert after == before  # ids, order and scores, in every mode, to the last bit


def test_a_reader_opened_before_another_collection_never_searches_it(location, embedder, chunker, tmp_path):
    ingest(location, [write_corpus(tmp_path / "alpha", ALPHA)], embedder=embedder, chunker=chunker,
           collection="alpha")
    index = _open(location, embedder)
    try:
        assert index.collections() == {"alpha": 3}  # read now, and kept: alpha is alone
        question = "Ledger 4682, page after page"
        vector = lambda: embedder.embed([question])[0]  # noqa: E731
        before = {mode: retrieve(index, question, vector, 10, mode, collection="alpha") for mode in MODES}
        # Another front-end's first commit to beta, between the reader's list and its next question.
        ingest(location, [write_corpus(tmp_path / "beta", {"numbers.md": "Ledger 4682, page after page.\n"})],
               embedder=embedder, chunker=chunker, collection="beta")
        for mode in MODES:
            hits = retrieve(index, question, vector, 10, mode, collection="alpha")
            assert {h.source for h in hits} <= set(ALPHA), mode
            assert [(h.chunk_id, h.score) for h in hits] == [(h.chunk_id, h.score) for h in before[mode]], mode
    finally:
        index.close()


def test_hnsw_keeps_to_the_collection_and_its_only_collection_keeps_the_graph(embedder, chunker, tmp_path,
                                                                              pgvector_url, monkeypatch):
    monkeypatch.setattr(postgres, "APPROXIMATE_FROM", 2)
    ingest(pgvector_url, [write_corpus(tmp_path / "alpha", ALPHA)], embedder=embedder, chunker=chunker,
           collection="alpha")
    index = _open(pgvector_url, embedder)
    statements: list[str] = []  # what the reader's connection is asked
    execute = index._db.execute

    def spied(sql, *args, **kwargs):
        statements.append(str(sql))
        return execute(sql, *args, **kwargs)

    monkeypatch.setattr(index._db, "execute", spied)
    try:
        assert index.stats()["vector_search"].startswith("approximate: HNSW")
        question = "Ledger 4682, page after page"
        vector = lambda: embedder.embed([question])[0]  # noqa: E731
        statements.clear()
        alone = [h.chunk_id for h in retrieve(index, question, vector, 2, "dense", collection="alpha")]
        assert alone == [h.chunk_id for h in index.search(vector(), 2)]  # filtered, as fast and the same as without
        assert not any("enable_indexscan" in sql for sql in statements)  # through the graph, not exactly
        ingest(pgvector_url, [write_corpus(tmp_path / "beta", {"numbers.md": "Ledger 4682, page after page.\n"})],
               embedder=embedder, chunker=chunker, collection="beta")
        assert index.search(vector(), 1)[0].source == "numbers.md"  # beta's chunk is the nearest now
        assert [h.chunk_id for h in retrieve(index, question, vector, 2, "dense", collection="alpha")] == alone
        statements.clear()
        crowded = retrieve(index, question, vector, 10, "dense", collection="alpha")
        assert {h.source for h in crowded} == set(ALPHA)  # all of alpha's, none of beta's
        assert any("enable_indexscan" in sql for sql in statements)  # fewer than k through the graph: exactly
    finally:
        index.close()


def test_bm25_statistics_are_those_of_the_chunks_within():
    alpha = {1: "Marker 4682 ledger.", 2: "Marker 9051 ledger.", 3: "Mark every page of the audit."}
    beta = {4: "Ledger 4682. " + "4682 " * 60, 5: FRENCH * 3, 6: "4682 again"}
    langs = {1: "en", 2: "en", 3: "en", 4: "en", 5: "fr", 6: "en"}
    both = {**alpha, **beta}
    whole = LexicalIndex.build(list(both), list(both.values()), [langs[i] for i in both])
    own = LexicalIndex.build(list(alpha), list(alpha.values()), [langs[i] for i in alpha])
    within = np.array(sorted(alpha))
    assert whole.domain(within).languages == ("en",) and whole.languages == ("en", "fr")
    for question in QUESTIONS:
        expected = own.search(question, 5)
        assert expected and whole.search(question, 5, within=within) == expected, question
        assert whole.search(question, 5, allowed=np.array([2, 3, 4]), within=within) == \
            [(i, s) for i, s in expected if i in (2, 3)], question  # allowed filters; beta's 4 is never within
    # What the searches did before: the whole index's statistics, only the chunks allowed kept.
    assert whole.search("4682 9051", 5, allowed=within) != own.search("4682 9051", 5)


def test_bm25_ties_go_by_chunk_id_not_by_where_a_row_lies():
    texts = {1: "Marker 4682 ledger.", 2: "Marker 9051 ledger.", 3: "Mark every page of the audit."}
    ranked = LexicalIndex.build([1, 2, 3], list(texts.values())).search("4682 9051", 5)
    assert [i for i, _ in ranked] == [1, 2] and ranked[0][1] == ranked[1][1]
    for order in ([2, 1, 3], [3, 2, 1]):  # rows in another order (another collection's rows between them, say)
        index = LexicalIndex.build(order, [texts[i] for i in order])
        assert index.search("4682 9051", 5) == ranked and index.search("4682 9051", 1) == ranked[:1]
