"""An adversarial suite over the real HTTP server (issue 55), in both
stores: a folder index with its conversations in SQLite, and a PostgreSQL
index with its conversations in PostgreSQL.

The cases are generated from the rights, not hand-picked: every caller
(each key file holder, a plain key, no key, a wrong key) against every
other holder's conversation, named by its bare id and by its id as
stored, read, deleted and continued over /v1/ask and
/v1/chat/completions; then the side doors: the BM25 order of one
collection while another gains a word, cached prompt tokens between
collections, the service's own figures, claims, watched folders. The
measure is always what reaches the caller: no byte of another's
conversation or collection."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rag import Pipeline
from rag.service import LoopbackServer, ServiceSettings, create_app
from rag.service.keys import KeyRing, key_hash, new_key
from rag.service.owners import stored_session

from .conftest import write_corpus
from .test_collections_service import ROUTES

ALPHA = "The alpha secret code is 7319."
BETA = "The beta secret code is 4682."
ALICE, _ = new_key()
BOB, _ = new_key()
ADMIN, _ = new_key()
PLAIN, _ = new_key()
KEYS = {"alice": ALICE, "bob": BOB, "admin": ADMIN, "plain": PLAIN, "none": None, "wrong": "rag_not-a-key"}
RIGHTS = {"alice": {"alpha": "write", "default": "read"}, "bob": {"beta": "read"}, "admin": {"*": "write"},
          "plain": {"*": "write"}}
COLLECTIONS = ("default", "alpha", "beta")


@dataclass(frozen=True)
class Held:
    """A conversation a caller holds: its owner, collection, id, and a word only its turns hold."""

    owner: str
    collection: str
    session: str
    word: str


# Each one asked once at the start, by its owner: the word is in its question, so in its stored turns.
HELD = (Held("alice", "alpha", "s1", "Quillfeather"), Held("plain", "default", "p1", "Marrowstone"),
        Held("admin", "beta", "a1", "Thistledown"))


def _right(holder: str, collection: str) -> str | None:
    rights = RIGHTS.get(holder, {})
    return rights.get(collection) or rights.get("*")


def _headers(holder: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[holder]}"} if KEYS[holder] else {}


@pytest.fixture(scope="module", params=["folder", "postgresql"])
def world(request, tmp_path_factory, embedder, backend):
    """The service over a fresh index of three collections and its conversations, in one store or the other."""
    root = tmp_path_factory.mktemp(f"adversary-{request.param}")
    if request.param == "folder":
        index, conversations = root / "index", root / "conversations.sqlite"
    else:
        cluster = request.getfixturevalue("pgvector_cluster")
        index, conversations = cluster.new_database(), cluster.new_database()
    p = Pipeline.open(index, embedder=embedder, backend=backend, conversations=conversations)
    p.ingest([write_corpus(root / "corpus")])
    p.ingest([write_corpus(root / "alpha", {"alpha.md": ALPHA})], collection="alpha")
    p.ingest([write_corpus(root / "beta", {"beta.md": BETA})], collection="beta")
    keys = root / "keys.json"
    keys.write_text(json.dumps({"keys": {name: {"sha256": key_hash(KEYS[name]), "collections": rights}
                                         for name, rights in RIGHTS.items() if name != "plain"}}), encoding="utf-8")
    server = LoopbackServer(create_app(p, ServiceSettings(keys_file=keys, api_keys=[PLAIN], rate_limit_per_minute=0,
                                                          auth_failures_per_minute=100_000)))
    for held in HELD:
        r = httpx.post(f"{server.url}/v1/ask", headers=_headers(held.owner), timeout=120, json={
            "question": f"What is the code {held.word}?", "collection": held.collection, "session": held.session,
            "max_tokens": 2})
        assert r.status_code == 200 and r.json()["turn"] == 1, r.text
    yield server, p, root
    server.stop()
    p.close()


def _caller(holder: str):
    """The caller a holder's key is, as the service sees it (for working out stored ids)."""
    if holder == "plain":
        return KeyRing.plain([PLAIN]).caller(PLAIN)
    from rag.service.keys import Caller

    return Caller(holder, RIGHTS[holder])


def _turns(p: Pipeline, held: Held) -> int:
    stored = stored_session(p.conversations, _caller(held.owner), held.collection, held.session)
    return len(p.conversation(stored).turns)


# Every route, every caller, every collection (and one that does not exist): what each must get is worked
# out from the caller's rights, as tests/test_collections_service.py does over PostgreSQL alone.
ROUTE_TABLE = [(route, caller, collection) for route, caller, collection
               in itertools.product(ROUTES, KEYS, (*COLLECTIONS, "nosuch"))]


@pytest.mark.parametrize("route, caller, collection", ROUTE_TABLE, ids=[f"{r}-{k}-{c}" for r, k, c in ROUTE_TABLE])
def test_every_route_with_every_caller_and_collection(world, route, caller, collection):
    server, _, _ = world
    writes, call = ROUTES[route]
    method, path, options = call(collection)
    r = httpx.request(method, f"{server.url}{path}", headers=_headers(caller), timeout=300, **options)
    right = _right(caller, collection)
    if caller in ("none", "wrong"):
        assert r.status_code == 401, r.text
    elif right is None:
        assert r.status_code == 404 and "holds no documents" in r.json()["error"]["message"], r.text
    elif writes and right != "write":
        assert r.status_code == 403, r.text
    elif route in ("search", "ask", "chat") and collection == "nosuch":
        assert r.status_code == 404 and "holds no documents" in r.json()["error"]["message"], r.text
    elif route in ("search", "ask", "chat", "list"):
        assert r.status_code == 200, r.text
    else:
        assert r.status_code not in (401, 403), r.text
    for text, holder in ((ALPHA, "alpha"), (BETA, "beta")):
        if _right(caller, holder) is None or collection != holder:
            assert text not in r.text and text.split()[-1] not in r.text  # not a byte of another collection


# Every caller other than the owner, every conversation, both namings, every way of reaching it.
ACTIONS = ("read", "delete", "ask", "chat-session", "chat-user")
CASES = [(caller, held, naming, action) for caller, held, naming, action
         in itertools.product(KEYS, HELD, ("bare", "stored"), ACTIONS) if caller != held.owner]


def _expected(caller: str, held: Held, naming: str, action: str) -> set[int]:
    """The statuses allowed: every one of them tells nothing of the owner's conversation."""
    if caller in ("none", "wrong"):
        return {401}
    if _right(caller, held.collection) is None:
        return {404}
    if action in ("read", "delete"):
        return {404}  # another's conversation reads as none, and deleting it answers as reading does
    if naming == "bare":
        return {200}  # the caller's own conversation of that id: ids are per holder and collection
    return {200, 400}  # its own too (400: an id too long to carry its owner)


@pytest.mark.parametrize("caller, held, naming, action", CASES,
                         ids=[f"{c}-{h.owner}:{h.session}-{n}-{a}" for c, h, n, a in CASES])
def test_no_caller_reaches_another_holders_conversation(world, caller, held, naming, action):
    server, p, _ = world
    before = _turns(p, held)
    name = held.session if naming == "bare" else stored_session(
        p.conversations, _caller(held.owner), held.collection, held.session)
    headers, params = _headers(caller), {"collection": held.collection}
    url = f"{server.url}/v1/sessions/{name}"
    chat = {"model": "rag", "messages": [{"role": "user", "content": "What was my last question?"}],
            "collection": held.collection, "max_tokens": 2}
    r = {
        "read": lambda: httpx.get(url, params=params, headers=headers, timeout=60),
        "delete": lambda: httpx.delete(url, params=params, headers=headers, timeout=60),
        "ask": lambda: httpx.post(f"{server.url}/v1/ask", headers=headers, timeout=120, json={
            "question": "What was my last question?", "collection": held.collection, "session": name,
            "max_tokens": 2}),
        "chat-session": lambda: httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120,
                                           json=chat | {"session": name}),
        "chat-user": lambda: httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120,
                                        json=chat | {"user": name}),
    }[action]()
    assert r.status_code in _expected(caller, held, naming, action), r.text
    assert held.word not in r.text  # not one byte of the owner's turns
    if r.status_code == 200 and action == "ask":
        assert r.json()["turn"] == 1  # a conversation of its own, not the owner's continued
    assert _turns(p, held) == before  # the owner's conversation is as it was: not deleted, not continued


def test_the_local_user_cannot_name_a_holders_conversation_by_its_stored_id(world):
    # A service without keys (loopback: the local user) over the same stores.
    _, p, _ = world
    keyless = LoopbackServer(create_app(p, ServiceSettings(rate_limit_per_minute=0)))
    try:
        for held in HELD:
            stored = stored_session(p.conversations, _caller(held.owner), held.collection, held.session)
            params = {"collection": held.collection}
            for r in (httpx.get(f"{keyless.url}/v1/sessions/{stored}", params=params),
                      httpx.delete(f"{keyless.url}/v1/sessions/{stored}", params=params),
                      httpx.post(f"{keyless.url}/v1/ask", timeout=120, json={
                          "question": "What was my last question?", "collection": held.collection,
                          "session": stored, "max_tokens": 2})):
                assert r.status_code in (200, 404) and held.word not in r.text, r.text
                if r.request.method != "POST":
                    assert r.status_code == 404
            listed = httpx.get(f"{keyless.url}/v1/sessions", params=params).text
            assert held.word not in listed
            assert _turns(p, held) == 1
    finally:
        keyless.stop()


def test_every_holder_reads_and_lists_its_own(world):
    server, _, _ = world
    for held in HELD:
        headers, params = _headers(held.owner), {"collection": held.collection}
        mine = httpx.get(f"{server.url}/v1/sessions/{held.session}", params=params, headers=headers)
        assert mine.status_code == 200 and held.word in mine.text, mine.text
        listed = httpx.get(f"{server.url}/v1/sessions", params=params, headers=headers).json()["sessions"]
        assert held.session in {s["session"] for s in listed}
        for other in KEYS:
            if other != held.owner and _right(other, held.collection) is not None:
                theirs = httpx.get(f"{server.url}/v1/sessions", params=params, headers=_headers(other))
                assert theirs.status_code == 200 and held.word not in theirs.text


def test_ids_lock_nobody_out(world):
    # Ids are per holder and collection: whoever named an id first, in whatever collection, and whether
    # its request failed or was answered, every other holder's same id is its own conversation.
    server, _, _ = world
    alice, bob, admin = _headers("alice"), _headers("bob"), _headers("admin")

    def ask(headers, collection, session, **extra):
        return httpx.post(f"{server.url}/v1/ask", headers=headers, timeout=120, json={
            "question": "What is the secret code?", "collection": collection, "session": session,
            "max_tokens": 2} | extra)

    failed = ask(bob, "beta", "z1", max_tokens=100_000)  # refused: over the service's limit
    assert failed.status_code == 400, failed.text
    assert ask(alice, "alpha", "z1").json()["turn"] == 1  # bob's failed request took nothing
    assert ask(bob, "beta", "z2").json()["turn"] == 1  # bob's own id in beta...
    assert ask(alice, "alpha", "z2").json()["turn"] == 1  # ...is alice's own in alpha
    assert ask(admin, "alpha", "z2").json()["turn"] == 1  # and admin's own beside alice's, in alpha too
    assert ask(alice, "alpha", "z2").json()["turn"] == 2  # alice's goes on, untouched


def test_the_services_figures_are_for_keys_that_may_read_every_collection(world):
    server, p, root = world
    # Even where the docs are made public, /metrics is not.
    public = LoopbackServer(create_app(p, ServiceSettings(keys_file=root / "keys.json", api_keys=[PLAIN],
                                                          public_docs=True, rate_limit_per_minute=0)))
    try:
        assert httpx.get(f"{public.url}/openapi.json").status_code == 200
        assert httpx.get(f"{public.url}/metrics").status_code == 401
        assert httpx.get(f"{public.url}/metrics", headers=_headers("bob")).status_code == 403
        assert httpx.get(f"{public.url}/metrics", headers=_headers("admin")).status_code == 200
    finally:
        public.stop()
    for holder in KEYS:
        for path in ("/metrics", "/v1/profile"):
            r = httpx.get(f"{server.url}{path}", headers=_headers(holder), timeout=120)
            if holder in ("none", "wrong"):
                assert r.status_code == 401, (holder, path, r.text)
            elif _right(holder, "alpha") is not None and _right(holder, "beta") is not None:
                assert r.status_code == 200, (holder, path, r.text)
            else:
                assert r.status_code == 403 and "every collection" in r.text, (holder, path, r.text)


def test_a_collections_bm25_ranking_is_the_same_whatever_another_collection_holds(world, tmp_path):
    server, p, _ = world
    for name, text in {"m4682.md": "Marker 4682 ledger.", "m9051.md": "Marker 9051 ledger."}.items():
        r = httpx.post(f"{server.url}/v1/documents", params={"collection": "alpha"}, headers=_headers("alice"),
                       timeout=300, files={"file": (name, text.encode())})
        assert r.status_code == 200, r.text

    def ranked() -> list[tuple[str, float]]:
        r = httpx.post(f"{server.url}/v1/search", headers=_headers("alice"), timeout=60, json={
            "query": "4682 9051", "collection": "alpha", "retrieval": "bm25", "k": 10})
        assert r.status_code == 200, r.text
        return [(h["chunk_id"], h["text"], h["score"]) for h in r.json()["results"]]

    before = ranked()
    assert {t for _, t, _ in before} >= {"Marker 4682 ledger.", "Marker 9051 ledger."}
    flood = " ".join(["Ledger 4682 entry."] * 40)
    r = httpx.post(f"{server.url}/v1/documents", params={"collection": "beta"}, headers=_headers("admin"),
                   timeout=300, files={"file": ("flood.md", flood.encode())})
    assert r.status_code == 200, r.text
    assert ranked() == before  # byte for byte: the order and the scores tell nothing of beta


def test_no_collections_prompt_reuses_anothers_cached_cells(world):
    # The same document under the same name in two collections: a question in the second must find in the
    # engine's caches no more than a prompt never asked before finds (the system prompt), or the first
    # token's time would tell what the first collection holds.
    server, _, _ = world
    admin = _headers("admin")
    for collection in ("twin-a", "twin-b", "twin-c"):
        r = httpx.post(f"{server.url}/v1/documents", params={"collection": collection}, headers=admin, timeout=300,
                       files={"file": ("ledger.md", b"The quarterly ledger closes on the ninth working day.")})
        assert r.status_code == 200, r.text

    def cached(collection: str) -> int:
        r = httpx.post(f"{server.url}/v1/ask", headers=admin, timeout=120, json={
            "question": "When does the quarterly ledger close?", "collection": collection, "max_tokens": 2})
        assert r.status_code == 200, r.text
        return r.json()["timings"]["cached_tokens"]

    never = cached("twin-c")  # a prompt none asked before: what any prompt finds cached
    cached("twin-a")
    assert cached("twin-a") > never + 10  # its own collection reuses its cells
    assert cached("twin-b") <= never + 2  # the twin finds nothing of twin-a's (a token or two of its heading)


def test_no_caller_reads_anothers_question_through_the_engines_cache(world):
    # The plain key asks a question in a collection of one document, in a conversation and alone. Admin,
    # who may read it too, then asks that very question and a wrong guess of it: if the cells the plain
    # key's prompts left were reused, the right guess would find more cached (and start sooner) than the
    # wrong one, and a guess could be confirmed token by token. Each finds only what its own earlier
    # prompts left: the system prompt, the collection's heading and passage.
    server, _, _ = world
    plain, admin = _headers("plain"), _headers("admin")
    secret = "Does the Quillfeather merger close on the ninth of March?"
    guess = "Will the Quillfeather merger close on the ninth of March?"
    r = httpx.post(f"{server.url}/v1/documents", params={"collection": "vault"}, headers=admin, timeout=300,
                   files={"file": ("vault.md", b"The vault holds the merger papers and the board's letters.")})
    assert r.status_code == 200, r.text

    def cached(headers, question, **extra) -> int:
        r = httpx.post(f"{server.url}/v1/ask", headers=headers, timeout=120, json={
            "question": question, "collection": "vault", "max_tokens": 2} | extra)
        assert r.status_code == 200, r.text
        timings = r.json()["timings"]
        # Nor the cells the other callers' prompts hold (how long theirs are), nor whether one was shared.
        assert timings["others_cells"] is None and timings["shared_prefill"] is None, timings
        return timings["cached_tokens"]

    for extra in ({"session": "h1"}, {"session": "h1"}, {}, {}):
        cached(plain, secret, **extra)
    cached(admin, "What does the vault hold?")  # admin's own cells: the system prompt, heading and passage
    wrong, right = cached(admin, guess), cached(admin, secret)
    assert right <= wrong + 3, (right, wrong)  # the plain key's question is not read back
    for session, question in (("g-wrong", guess), ("g-right", secret)):
        cached(admin, question, session=session)
    wrong = cached(admin, "And then?", session="g-wrong")
    right = cached(admin, "And then?", session="g-right")
    assert right <= wrong + 3, (right, wrong)  # nor its conversation's turns


def _served_watching(pipeline: Pipeline, watch: list[str], collections: tuple[str, ...]) -> None:
    """Serve ``pipeline`` watching ``watch`` until each of ``collections``
    holds a document (the watchers' first ingests), then stop."""
    import time

    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0, watch=watch)))
    try:
        deadline = time.monotonic() + 120  # an upper bound on the watchers' first ingests, not a timing assertion
        while time.monotonic() < deadline and not all(pipeline.documents(c) for c in collections):
            time.sleep(0.5)
    finally:
        server.stop()


def test_a_watched_folder_holding_the_index_takes_nothing_of_its_uploads(tmp_path, embedder, backend):
    home = tmp_path / "home"
    pipeline = Pipeline.open(home / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite")
    try:
        pipeline.library.add("secret.md", BETA.encode(), collection="beta")  # -> home/index-uploads-beta/
        write_corpus(home / "notes", {"notes.md": "Shared notes about the harbour."})
        (home / "readme.md").write_text("What this folder holds: notes, and the index.")
        _served_watching(pipeline, [str(home), f"{home / 'notes'}=alpha"], ("default", "alpha"))
        # The folder was ingested, but neither the index's own folders nor alpha's watched folder inside it.
        assert {d["source"] for d in pipeline.documents()} == {"readme.md"}
        assert {d["source"] for d in pipeline.documents("alpha")} == {"notes.md"}  # DIR=COLLECTION
    finally:
        pipeline.close()


def test_a_watched_folder_inside_another_collections_is_that_ones_alone(tmp_path, embedder, backend):
    home = tmp_path / "data"
    write_corpus(home, {"shared.md": "Shared notes about the harbour."})
    write_corpus(home / "teamb", {"plans.md": BETA})
    pipeline = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite")
    try:
        _served_watching(pipeline, [str(home), f"{home / 'teamb'}=beta"], ("default", "beta"))
        assert {d["source"] for d in pipeline.documents()} == {"shared.md"}  # not teamb/plans.md
        assert {d["source"] for d in pipeline.documents("beta")} == {"plans.md"}
    finally:
        pipeline.close()


def test_a_deleted_collections_uploads_are_removed(world):
    server, p, _ = world
    admin = _headers("admin")
    r = httpx.post(f"{server.url}/v1/documents", params={"collection": "scratch"}, headers=admin, timeout=300,
                   files={"file": ("draft.md", b"A draft of no importance.")})
    assert r.status_code == 200, r.text
    folder = p.library.upload_folder("scratch")
    assert (folder / "draft.md").is_file()
    # A folder with another collection's uploads name that no upload made is left alone when it is deleted.
    stranger = p.library.upload_folder("stranger")
    stranger.mkdir(parents=True)
    (stranger / "keep.md").write_text("Not the service's.")
    r = httpx.post(f"{server.url}/v1/collections", headers=admin, json={"name": "stranger"})
    assert r.status_code == 201, r.text
    assert httpx.delete(f"{server.url}/v1/collections/scratch", headers=admin).status_code == 200
    assert httpx.delete(f"{server.url}/v1/collections/stranger", headers=admin).status_code == 200
    assert not folder.exists() and (stranger / "keep.md").is_file()
