"""The index interface (rag/index/interface.py), the same tests over every
store, as tests/backend_contract.py is for the engines: the folder store
(FAISS, BM25 arrays, SQLite) and PostgreSQL with pgvector, each reached only
through ``rag.index.location``. A new store joins by a line in ``STORES``."""

from __future__ import annotations

import pytest

from rag.errors import IndexMismatch, IndexNotFound
from rag.index.interface import IndexReader, IndexWriter
from rag.index.location import index_exists, live_manifest, live_name, open_index, open_writer, store_for, verify
from rag.ingest.run import ingest
from tests.conftest import CORPUS, write_corpus

STORES = ("folder", "postgresql")


@pytest.fixture(params=STORES)
def location(request, tmp_path):
    """An empty index location of each store."""
    if request.param == "folder":
        return tmp_path / "index"
    return request.getfixturevalue("pgvector_url")


@pytest.fixture
def built(location, embedder, chunker, corpus):
    ingest(location, [corpus], embedder=embedder, chunker=chunker)
    index = open_index(location, embedder=embedder.name, dim=embedder.dim)
    yield location, index
    index.close()


def test_an_empty_location_holds_no_index(location, embedder):
    assert not index_exists(location) and live_name(location) is None
    with pytest.raises(IndexNotFound):
        open_index(location, embedder=embedder.name, dim=embedder.dim)


def test_the_reader_answers_every_call_of_the_interface(built, embedder):
    location, index = built
    assert isinstance(index, IndexReader) and index_exists(location) and live_name(location)
    assert live_manifest(location).embedder == embedder.name and len(index) >= len(CORPUS)
    q = embedder.embed(["How long does the dough rise?"])[0]
    hits = index.search(q, 3)
    assert hits[0].source == "guide/cooking.rst" and hits[0].score >= hits[-1].score
    assert [h.chunk_id for h in index.hits([i for i, _ in index.search_ids(q, 3)], q)] == [h.chunk_id for h in hits]
    assert index.lexical_search("dough", 5) and index.lexical() is not None
    # Words the documents never use (a stop word has no terms: it is heard).
    assert index.unheard(["dough", "Flour", "zeppelin", "the"]) == ["zeppelin"]
    assert index.unheard(["zeppelin"], collection="nowhere") == ["zeppelin"]
    assert index.unheard(["dough"], collection="nowhere") == ["dough"]
    allowed = index.chunk_ids_of(lambda source: source.startswith("guide/"), "guide")
    assert {h.source for h in index.search(q, 10, allowed)} <= {"guide/cooking.rst", "guide/garden.html"}
    # Each chunk comes back with its document's units as its reader found them, about their heading.
    assert hits[0].units and all(0 <= u.start < u.end <= len(hits[0].text) for u in hits[0].units)
    assert any(u.about and u.kind == "text" for u in hits[0].units)
    assert {source for _, source in index.files()} == set(CORPUS)
    assert len(index.passages()) == len(index.chunks()) == len(index)
    stats = index.stats()
    assert stats["files"] == len(CORPUS) and stats["chunks"] == len(index) and stats["languages"] == {"en": len(index)}
    assert verify(location)["live"] == live_name(location)


def test_the_writer_publishes_on_commit_only(built, embedder):
    location, index = built
    before = live_name(location)
    with pytest.raises(RuntimeError):
        with open_writer(location, live_manifest(location)) as writer:
            assert isinstance(writer, IndexWriter)
            (record,) = [r for (_, s), r in writer.files().items() if s == "decode.txt"]
            writer.remove_file(record.id)
            raise RuntimeError("a crash before commit")
    assert live_name(location) == before
    with open_writer(location, live_manifest(location)) as writer:
        (record,) = [r for (_, s), r in writer.files().items() if s == "decode.txt"]
        writer.remove_file(record.id)
        writer.commit()
    assert live_name(location) != before
    again = open_index(location, embedder=embedder.name, dim=embedder.dim)
    try:
        assert "decode.txt" not in {s for _, s in again.files()}
    finally:
        again.close()


def test_another_embedder_is_refused(built):
    location, _ = built
    with pytest.raises(IndexMismatch):
        open_index(location, embedder="another-model", dim=384)


def test_each_location_has_one_store():
    assert type(store_for("postgresql://u@h/db")) is not type(store_for("/tmp/index"))


CONTRACT = "Acme's maintenance contract renews every March at a price of 41,000 euros, signed by Dana Reyes."


def _sources(hits) -> set[str]:
    return {h.source for h in hits}


def test_collections_keep_to_themselves(built, embedder, chunker, tmp_path):
    from rag.errors import CollectionNotFound
    from rag.retrieval.search import retrieve

    location, index = built
    index.close()
    other = write_corpus(tmp_path / "customer", {"contract.md": CONTRACT})
    ingest(location, [other], embedder=embedder, chunker=chunker, collection="acme")
    # The same folder ingested into a third collection is that collection's own copy: nothing of the others moves.
    ingest(location, [other], embedder=embedder, chunker=chunker, collection="acme-copy")
    index = open_index(location, embedder=embedder.name, dim=embedder.dim)
    try:
        assert index.collections() == {"default": len(CORPUS), "acme": 1, "acme-copy": 1}
        assert {s for _, s in index.files()} == set(CORPUS) and {s for _, s in index.files(collection="acme")} == \
            {"contract.md"}
        vector = lambda: embedder.embed([CONTRACT])[0]  # noqa: E731 - the other collection's text, word for word
        for mode in ("dense", "bm25", "hybrid"):
            assert "contract.md" not in _sources(retrieve(index, CONTRACT, vector, 20, mode))
            assert _sources(retrieve(index, CONTRACT, vector, 20, mode, collection="acme")) == {"contract.md"}
        with pytest.raises(CollectionNotFound, match="holds no documents"):
            retrieve(index, CONTRACT, vector, 5, "hybrid", collection="nobody")
        assert index.stats()["collections"] == index.collections()
    finally:
        index.close()
    with open_writer(location, live_manifest(location), collection="acme") as writer:
        assert set(writer.files()) == {(str(other.resolve()), "contract.md")}
        assert writer.remove_collection() == 1
        writer.commit()
    index = open_index(location, embedder=embedder.name, dim=embedder.dim)
    try:
        assert index.collections() == {"default": len(CORPUS), "acme-copy": 1}
    finally:
        index.close()


def test_a_collection_is_made_empty_kept_when_emptied_and_gone_when_deleted(built, embedder, chunker, tmp_path):
    location, index = built
    index.close()

    def collections() -> dict[str, int]:
        opened = open_index(location, embedder=embedder.name, dim=embedder.dim)
        try:
            return opened.collections()
        finally:
            opened.close()

    for expected in (True, False):  # made, then found there: a second create changes nothing
        with open_writer(location, live_manifest(location), collection="legal") as writer:
            assert writer.create_collection() is expected and writer.files() == {}
            writer.commit()
    assert collections() == {"default": len(CORPUS), "legal": 0}
    other = write_corpus(tmp_path / "legal", {"contract.md": CONTRACT})
    ingest(location, [other], embedder=embedder, chunker=chunker, collection="legal")
    assert collections()["legal"] == 1
    with open_writer(location, live_manifest(location), collection="legal") as writer:  # its one document goes
        for record in writer.files().values():
            writer.remove_file(record.id)
        writer.commit()
    assert collections() == {"default": len(CORPUS), "legal": 0}  # emptied, not deleted
    with open_writer(location, live_manifest(location), collection="legal") as writer:
        assert writer.remove_collection() == 0
        writer.commit()
    with open_writer(location, live_manifest(location), collection="legal") as writer:
        assert writer.remove_collection() is None  # no such collection any more
    assert collections() == {"default": len(CORPUS)}


def test_a_rebuild_never_drops_another_collection(built, embedder, chunker, tmp_path):
    from rag.errors import RagError

    location, index = built
    index.close()
    ingest(location, [write_corpus(tmp_path / "customer", {"contract.md": CONTRACT})], embedder=embedder,
           chunker=chunker, collection="acme")
    with open_writer(location, live_manifest(location), collection="empty") as writer:
        writer.create_collection()  # one that holds nothing is still the collection someone made
        writer.commit()
    before = live_name(location)
    with pytest.raises(RagError, match="would drop the collections acme, empty"):
        ingest(location, [tmp_path / "corpus"], embedder=embedder, chunker=chunker, rebuild=True)
    assert live_name(location) == before
