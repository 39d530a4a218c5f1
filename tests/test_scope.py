"""Questions scoped to a folder, a file or a type: applied inside dense,
BM25 and hybrid retrieval, before the budget, in the Python API, the CLI
and the service; a scope that matches nothing is one clear message."""

from __future__ import annotations

import httpx
import pytest

from rag.errors import RagError
from rag.retrieval import Scope
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import assert_clean_error, write_corpus

NOTES = {
    "notes/bread.md": "# Bread\n\nKnead the dough for ten minutes, then let the bread dough rise for two hours.\n",
    "notes/pizza.txt": "Pizza dough rises overnight in the fridge; bake it on a hot stone.\n",
    "recipes/brioche.html": "<h1>Brioche</h1><p>Brioche dough is rich with butter and eggs and rises slowly.</p>",
    "recipes/bagels.rst": "Bagels\n======\n\nBagel dough is boiled before it is baked; it rises only briefly.\n",
    "garden/tomatoes.md": "# Tomatoes\n\nTomatoes need sun, water and stakes.\n",
}


@pytest.fixture
def pipeline(pipeline_factory, tmp_path):
    p = pipeline_factory(tmp_path / "index")
    p.ingest([write_corpus(tmp_path / "docs", NOTES)])
    return p


def test_scope_matches_sources_and_types():
    scope = Scope(sources=["notes/*"], types=["MD", ".txt"])
    assert scope.types == (".md", ".txt")
    assert scope.allows("notes/bread.md") and scope.allows("notes/pizza.txt") and not scope.allows("notes/x.html")
    assert not scope.allows("recipes/bread.md")
    assert Scope(sources=["**/*.rst"]).allows("recipes/bagels.rst") and Scope(sources=["bagels.rst"]).allows("a/bagels.rst")
    assert Scope().everything and Scope(types=["pdf"]).describe() == "--type pdf"
    with pytest.raises(ValueError, match="not a type rag-budget reads"):
        Scope(types=["exe"])
    with pytest.raises(ValueError, match="not a usable glob"):
        Scope(sources=["[z-a]"])
    with pytest.raises(ValueError, match="more than 4"):
        Scope(sources=["**/" * 12 + "x"])  # would take exponential time to match


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_every_mode_returns_the_best_in_scope_not_what_is_left_of_the_best(pipeline, mode):
    everything = pipeline.search("how long does dough rise", k=2, mode=mode)
    assert any(h.source.startswith("notes/") for h in everything)
    scoped = pipeline.search("how long does dough rise", k=2, mode=mode, scope={"sources": ["recipes/**"]})
    assert len(scoped) == 2 and {h.source for h in scoped} == {"recipes/brioche.html", "recipes/bagels.rst"}
    typed = pipeline.search("dough", k=3, mode=mode, scope=Scope(types=["txt"]))
    assert [h.source for h in typed] == ["notes/pizza.txt"]


def test_the_budget_sees_only_passages_in_scope(pipeline):
    retrieval = pipeline.budgeted("How long does the dough rise?", scope={"types": ["rst", "html"]}, candidates=5,
                                  no_target=True)
    assert retrieval.budget.candidates == 2
    assert {d.source for d in retrieval.budget.decisions} == {"recipes/brioche.html", "recipes/bagels.rst"}
    answer = pipeline.ask("How long does the dough rise?", scope={"sources": ["notes/bread.md"]}, max_tokens=8)
    assert [s.source for s in answer.sources] == ["notes/bread.md"]


def test_a_scope_matching_nothing_is_a_clear_error(pipeline):
    with pytest.raises(RagError, match=r"no document in the index matches --source 'reports/\*' --type pdf \(5 documents"):
        pipeline.search("dough", scope={"sources": ["reports/*"], "types": ["pdf"]})
    with pytest.raises(RagError, match="scope.types"):
        pipeline.ask("dough", scope={"types": ["exe"]})


def test_the_command_line_takes_source_and_type(run, tmp_path):
    index = tmp_path / "index"
    run("ingest", write_corpus(tmp_path / "docs", NOTES), "--index", index)
    result = run("search", "dough", "--index", index, "--source", "recipes/*", "--source", "garden/*", "--type", "rst",
                 "--json")
    assert result.exit_code == 0, result.output
    assert [r["source"] for r in __import__("json").loads(result.stdout)["results"]] == ["recipes/bagels.rst"]
    assert_clean_error(run("search", "dough", "--index", index, "--type", "exe"), "--type", ".exe is not a type")
    assert_clean_error(run("ask", "dough?", "--index", index, "--source", "nowhere/*"), "no document in the index matches")


def test_the_service_takes_a_scope_on_ask_and_chat(pipeline):
    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    try:
        r = httpx.post(f"{server.url}/v1/ask", timeout=120, json={
            "question": "How long does dough rise?", "max_tokens": 8, "scope": {"sources": ["notes/*"], "types": ["txt"]}})
        assert r.status_code == 200, r.text
        assert {s["source"] for s in r.json()["sources"]} == {"notes/pizza.txt"}
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "What do tomatoes need?"}], "max_tokens": 8,
            "scope": {"sources": ["garden/**"]}})
        assert r.status_code == 200 and {s["source"] for s in r.json()["sources"]} == {"garden/tomatoes.md"}
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "dough?", "scope": {"types": ["pdf"]}})
        assert r.status_code == 400 and r.json()["error"]["type"] == "scope_matches_nothing"
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "dough?", "scope": {"types": ["exe"]}})
        assert r.status_code == 422 and "not a type rag-budget reads" in r.json()["error"]["message"]
    finally:
        server.stop()
