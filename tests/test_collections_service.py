"""A team on one service (issue 46): keys with different rights over
collections, on the real HTTP server in front of the real PostgreSQL index.
The table of every route with every key and collection, worked out from the
rights, runs over both stores in tests/test_adversarial_service.py, which
takes ``ROUTES`` from here."""

from __future__ import annotations

import json

import httpx
import pytest

from rag import Pipeline
from rag.service import LoopbackServer, ServiceSettings, create_app
from rag.service.keys import key_hash, new_key

from .conftest import CORPUS, write_corpus

BOARD = "The board approved the merger with Borealis Shipping on 3 June; the vote was seven to two."
ACME = "Acme's maintenance contract renews every March at a price of 41,000 euros, signed by Dana Reyes."
ALICE, _ = new_key()
BOB, _ = new_key()
CAROL, _ = new_key()
KEYS = {"alice": ALICE, "bob": BOB, "carol": CAROL, "nobody": "rag_not-a-key", None: None}
# alice may change acme and read the default collection; bob may read board only; carol may change every one.
RIGHTS = {"alice": {"acme": "write", "default": "read"}, "bob": {"board": "read"}, "carol": {"*": "write"}}


def _serve(p: Pipeline, keys) -> LoopbackServer:
    return LoopbackServer(create_app(p, ServiceSettings(keys_file=keys, rate_limit_per_minute=0,
                                                        auth_failures_per_minute=100_000)))


@pytest.fixture(scope="module")
def team(tmp_path_factory, pgvector_cluster, embedder, backend):
    """The PostgreSQL index of the three collections, and the key file."""
    root = tmp_path_factory.mktemp("team")
    url = pgvector_cluster.new_database()
    p = Pipeline.open(url, embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus")])
    p.ingest([write_corpus(root / "acme", {"contract.md": ACME})], collection="acme")
    p.ingest([write_corpus(root / "board", {"minutes.md": BOARD})], collection="board")
    keys = root / "keys.json"
    keys.write_text(json.dumps({"keys": {name: {"sha256": key_hash(KEYS[name]), "collections": rights}
                                         for name, rights in RIGHTS.items()}}), encoding="utf-8")
    yield p, url, keys


@pytest.fixture(scope="module")
def served(team):
    p, _, keys = team
    server = _serve(p, keys)
    yield server, p
    server.stop()
    p.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def conversations_served(request, served, team, embedder, backend):
    """The service over the same index with its conversations in SQLite, or in PostgreSQL."""
    if request.param == "sqlite":
        yield served[0]
        return
    _, url, keys = team
    p = Pipeline.open(url, embedder=embedder, backend=backend, conversations=request.getfixturevalue("postgres_url"))
    server = _serve(p, keys)
    yield server
    server.stop()
    p.close()


# Each route: how to call it for a collection, and whether it changes the collection.
ROUTES = {
    "search": (False, lambda c: ("POST", "/v1/search", {"json": {"query": "contract", "collection": c}})),
    "ask": (False, lambda c: ("POST", "/v1/ask", {"json": {"question": "What is it about?", "collection": c,
                                                          "max_tokens": 4}})),
    "retrieve": (False, lambda c: ("POST", "/v1/retrieve", {"json": {"question": "What is it about?", "collection": c}})),
    "chat": (False, lambda c: ("POST", "/v1/chat/completions", {"json": {
        "model": "rag", "messages": [{"role": "user", "content": "What is it about?"}], "collection": c,
        "max_tokens": 4}})),
    "list": (False, lambda c: ("GET", "/v1/documents", {"params": {"collection": c}})),
    "text": (False, lambda c: ("GET", "/v1/documents/0000000000000000/text", {"params": {"collection": c}})),
    "upload": (True, lambda c: ("POST", "/v1/documents", {"params": {"collection": c},
                                                         "files": {"file": (f"note-{c}.md", b"A short note.")}})),
    "delete": (True, lambda c: ("DELETE", "/v1/documents/0000000000000000", {"params": {"collection": c}})),
    "create": (True, lambda c: ("POST", "/v1/collections", {"json": {"name": c}})),
}
# Every route with every caller and collection, over both stores, is tests/test_adversarial_service.py's table.


def test_a_collection_the_key_may_not_read_is_told_as_one_that_does_not_exist(served):
    server, _ = served
    as_alice = {"Authorization": f"Bearer {ALICE}"}
    hidden = httpx.post(f"{server.url}/v1/search", json={"query": "merger", "collection": "board"}, headers=as_alice)
    absent = httpx.post(f"{server.url}/v1/search", json={"query": "merger", "collection": "nosuch"}, headers=as_alice)
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["error"]["message"].replace("board", "X") == absent.json()["error"]["message"].replace(
        "nosuch", "X")
    listed = httpx.get(f"{server.url}/v1/collections", headers=as_alice).json()["collections"]
    assert {c["name"] for c in listed} == {"acme", "default"}


def test_a_collection_is_made_empty_over_http_and_listed_to_those_who_may_read_it(served):
    server, _ = served
    as_carol, as_alice = ({"Authorization": f"Bearer {k}"} for k in (CAROL, ALICE))
    made = httpx.post(f"{server.url}/v1/collections", json={"name": "drafts"}, headers=as_carol)
    assert made.status_code == 201 and made.json() == {"collection": "drafts", "created": True}, made.text
    again = httpx.post(f"{server.url}/v1/collections", json={"name": "drafts"}, headers=as_carol)
    assert again.status_code == 200 and again.json()["created"] is False
    listed = httpx.get(f"{server.url}/v1/collections", headers=as_carol).json()["collections"]
    assert {"name": "drafts", "documents": 0} in listed
    assert "drafts" not in {c["name"] for c in httpx.get(f"{server.url}/v1/collections", headers=as_alice).json()[
        "collections"]}
    assert httpx.post(f"{server.url}/v1/collections", json={"name": "no/slash"}, headers=as_carol).status_code == 422
    gone = httpx.delete(f"{server.url}/v1/collections/drafts", headers=as_carol)
    assert gone.status_code == 200 and gone.json()["deleted"] == {"collection": "drafts", "documents": 0}, gone.text
    assert httpx.delete(f"{server.url}/v1/collections/drafts", headers=as_carol).status_code == 404


def test_no_question_retrieves_another_collections_text(served):
    server, _ = served
    as_alice = {"Authorization": f"Bearer {ALICE}"}
    for collection in ("default", "acme"):  # the two alice may read; BOARD is the other's text word for word
        found = httpx.post(f"{server.url}/v1/search", headers=as_alice,
                           json={"query": BOARD, "k": 20, "collection": collection}).json()["results"]
        assert "minutes.md" not in {h["source"] for h in found}
        answer = httpx.post(f"{server.url}/v1/ask", headers=as_alice, timeout=120,
                            json={"question": BOARD, "collection": collection, "max_tokens": 8}).json()
        assert "minutes.md" not in {s["source"] for s in answer["sources"]}
        assert "Borealis" not in json.dumps(answer["evidence"])
    mine = httpx.post(f"{server.url}/v1/search", headers={"Authorization": f"Bearer {BOB}"},
                      json={"query": BOARD, "collection": "board"}).json()["results"]
    assert mine[0]["source"] == "minutes.md" and {h["source"] for h in mine} <= {"minutes.md", "note-board.md"}


def test_an_upload_lands_in_its_collection_only(served):
    server, p = served
    as_alice = {"Authorization": f"Bearer {ALICE}"}
    r = httpx.post(f"{server.url}/v1/documents", params={"collection": "acme"}, headers=as_alice, timeout=120,
                   files={"file": ("renewal.md", b"The renewal notice goes out in January.")})
    assert r.status_code == 200, r.text
    assert {d["source"] for d in p.documents("acme")} >= {"contract.md", "renewal.md"}
    assert "renewal.md" not in {d["source"] for d in p.documents()} | {d["source"] for d in p.documents("board")}
    assert {d["source"] for d in p.documents()} >= set(CORPUS)


def test_a_conversation_belongs_to_the_key_and_the_collection_it_was_opened_in(conversations_served):
    server = conversations_served
    alice, bob = ({"Authorization": f"Bearer {k}"} for k in (ALICE, BOB))

    def asked(headers, collection, question="When does the contract renew?", session="s1"):
        return httpx.post(f"{server.url}/v1/ask", headers=headers, timeout=120,
                          json={"question": question, "collection": collection, "session": session, "max_tokens": 8})

    def ask(headers, collection, question="When does the contract renew?", session="s1"):
        r = asked(headers, collection, question, session)
        assert r.status_code == 200, r.text
        return r.json()

    first = ask(alice, "acme")
    assert first["session"] == "s1" and first["turn"] == 1
    assert ask(alice, "acme", "And its price?")["turn"] == 2
    url = f"{server.url}/v1/sessions"
    assert httpx.get(f"{url}/s1", params={"collection": "acme"}, headers=alice).json()["session"] == "s1"
    assert [s["session"] for s in httpx.get(url, params={"collection": "acme"}, headers=alice).json()["sessions"]] \
        == ["s1"]
    # The same id in another collection is another conversation: it does not cross over.
    assert ask(alice, "default")["turn"] == 1
    # Bob, in the collection he may read: reading, listing, deleting alice's session find nothing of it.
    assert httpx.get(f"{url}/s1", params={"collection": "board"}, headers=bob).status_code == 404
    assert httpx.get(url, params={"collection": "board"}, headers=bob).json()["sessions"] == []
    assert httpx.delete(f"{url}/s1", params={"collection": "board"}, headers=bob).status_code == 404
    # Ids are per holder and collection (issue 55): "s1" in board is bob's own from its first turn, over
    # /v1/ask and /v1/chat/completions alike; nothing of alice's is read.
    mine = ask(bob, "board", "What did the board approve?")
    assert mine["turn"] == 1 and mine["session"] == "s1"

    def chat(extra: dict) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", headers=bob, timeout=120, json={
            "model": "rag", "messages": [{"role": "user", "content": "And the vote?"}], "collection": "board",
            "max_tokens": 4} | extra)

    continued = chat({"session": "s1"})
    assert continued.status_code == 200 and continued.json()["rag"]["turn"] == 2, continued.text
    assert continued.json()["rag"]["session"] == "s1"  # as bob names it, never as it is stored
    # The OpenAI ``user`` names an end user, whom two applications may both name: it is kept apart per key.
    assert chat({"user": "s1"}).status_code == 200
    # In acme carol, who may read it, has an "s1" of her own beside alice's: neither takes nor reads the other.
    carol = {"Authorization": f"Bearer {CAROL}"}
    theirs = ask(carol, "acme")
    assert theirs["turn"] == 1 and theirs["session"] == "s1"
    assert len(httpx.get(f"{url}/s1", params={"collection": "acme"}, headers=alice).json()["turns"]) == 2
    assert httpx.get(f"{url}/s1", params={"collection": "acme"}, headers=bob).status_code == 404  # no right: 404


def test_another_collections_cached_passages_are_never_reused(served, tmp_path):
    # Another collection's document, word for word and under its very name, uploaded where this caller may
    # write: its prompt must not reuse the cells (llama.cpp's prefix cache, exact passage KV) that the
    # other's prompts left, or the first token's time would tell that the other holds the text. Without the
    # collection's heading ahead of the passages, the two prompts are the same bytes. The measure is the
    # engine's own count of cached prompt tokens.
    _, p = served
    for collection in ("first", "twin"):  # two collections of their own, so the other tests' uploads are not in them
        p.ingest([write_corpus(tmp_path / "acme", {"contract.md": ACME})], collection=collection)
    question = "When does the maintenance contract renew?"
    p.ask(question, collection="first", max_tokens=4)
    again = p.ask(question, collection="first", max_tokens=4).timings
    twin = p.ask(question, collection="twin", max_tokens=4).timings
    assert again.cached_tokens > twin.cached_tokens + 20  # the same collection reuses its passage; the twin cannot
    assert abs(twin.prompt_tokens - again.prompt_tokens) <= 2  # the same prompt but for the collection's name


def test_two_collections_ingested_at_once_both_answer(served):
    import threading

    server, _ = served
    as_carol = {"Authorization": f"Bearer {CAROL}"}
    texts = {"north": "The northern depot opens at six and ships pallets by rail.",
             "south": "The southern depot closes at noon on Fridays and ships by truck."}
    statuses: dict[str, int] = {}

    def upload(collection: str) -> None:
        r = httpx.post(f"{server.url}/v1/documents", params={"collection": collection}, headers=as_carol,
                       timeout=300, files={"file": (f"{collection}.md", texts[collection].encode())})
        statuses[collection] = r.status_code

    threads = [threading.Thread(target=upload, args=(c,)) for c in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == {"north": 200, "south": 200}
    for collection in texts:
        answer = httpx.post(f"{server.url}/v1/ask", headers=as_carol, timeout=120,
                            json={"question": "When does the depot open or close?", "collection": collection,
                                  "max_tokens": 8}).json()
        assert {s["source"] for s in answer["sources"]} == {f"{collection}.md"}
