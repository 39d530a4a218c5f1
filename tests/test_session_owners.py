"""Whose a session id is (rag/service/owners.py) over a real SQLite
conversation store: stored ids are made with the store's secret, so no
caller can name another's; ids are per holder and collection, so no one
takes, locks or learns of another's; plain keys are a holder of their own;
each holder and collection has its own cache scope; a conversation stored
under an earlier release's computable id is moved under the secret one
when its holder names it, and only where that release's claim names it."""

from __future__ import annotations

import hashlib

import pytest

from rag.conversations import Turn, open_store
from rag.errors import SessionNotFound
from rag.service.keys import LOCAL_USER, Caller, KeyRing
from rag.service.owners import SHELL_USER, asking, cache_scope, own_sessions, stored_session

ALICE = Caller("alice", {"acme": "write", "default": "read"})
BOB = Caller("bob", {"*": "read"})
PLAIN = KeyRing.plain(["k1"]).caller("k1")


def turn() -> Turn:
    return Turn(1, "q?", "Context: ...\n\nQuestion: q?", "An answer.", 10)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "c.sqlite")
    yield s
    s.close()


def answered(store, caller, collection, session) -> str:
    """As the service does: the id resolved, then a turn stored under it."""
    stored, _ = asking(store, caller, collection, session)
    store.append_next(stored, "q?", "prompted", "An answer.", 10)
    return stored


def test_the_same_id_is_each_holders_and_each_collections_own(store):
    first = answered(store, ALICE, "acme", "s1")
    assert answered(store, ALICE, "acme", "s1") == first  # alice's conversation goes on
    others = {answered(store, who, where, "s1") for who, where in ((BOB, "acme"), (ALICE, "default"),
                                                                 (PLAIN, "acme"), (LOCAL_USER, "acme"))}
    assert first not in others and len(others) == 4
    assert len(store.load(first).turns) == 2 and all(len(store.load(s).turns) == 1 for s in others)


def test_stored_ids_are_not_computable_from_a_holders_name(store, tmp_path):
    stored = stored_session(store, ALICE, "acme", "s1")
    computable = hashlib.sha256(b"holder:alice").hexdigest()[:12]
    assert stored.endswith(":s1") and not stored.startswith(computable)
    other = open_store(tmp_path / "other.sqlite")  # another store draws another secret
    try:
        assert stored_session(other, ALICE, "acme", "s1") != stored
    finally:
        other.close()
    again = open_store(tmp_path / "c.sqlite")  # the same store, another process: the same secret
    try:
        assert stored_session(again, ALICE, "acme", "s1") == stored
    finally:
        again.close()


def test_no_caller_reaches_another_holders_conversation_by_its_stored_id(store):
    stored = answered(store, ALICE, "default", "s1")
    for caller in (PLAIN, BOB):
        reached = stored_session(store, caller, "default", stored)
        assert reached != stored and store.load(reached).turns == ()
    with pytest.raises(SessionNotFound):
        stored_session(store, LOCAL_USER, "default", stored)  # bare ids: one shaped as a stored one is refused
    assert own_sessions(store, LOCAL_USER, "default", store.sessions()) == []
    assert own_sessions(store, PLAIN, "default", store.sessions()) == []
    assert [s["session"] for s in own_sessions(store, ALICE, "default", store.sessions())] == ["s1"]


def test_plain_keys_are_a_holder_apart_from_the_local_user(store):
    store.append("mine", turn())  # the local user's, under the bare id
    stored = stored_session(store, PLAIN, "default", "mine")
    assert stored != "mine" and store.load(stored).turns == ()
    assert stored_session(store, LOCAL_USER, "default", "mine") == "mine"


def test_each_holder_and_collection_has_its_own_cache_scope(store):
    scopes = {cache_scope(store, who, where) for who in (ALICE, BOB, PLAIN) for where in ("acme", "default")}
    assert len(scopes) == 6 and "" not in scopes
    assert cache_scope(store, LOCAL_USER, "acme") == cache_scope(store, SHELL_USER, "default") == ""
    assert asking(store, SHELL_USER, "acme", "x", "abc.def") == ("x", "abc.def")  # its client names it


def test_the_local_user_keeps_its_bare_ids(store):
    answered(store, ALICE, "default", "x")
    assert stored_session(store, LOCAL_USER, "default", "x") == "x"
    store.append("x", turn())
    assert len(store.load(stored_session(store, ALICE, "default", "x")).turns) == 1
    assert stored_session(store, SHELL_USER, "acme", "x") == "x"  # the CLI through its resident server: as given


def _before(holder: str, collection: str) -> tuple[str, str]:
    tag = hashlib.sha256(f"holder:{holder}".encode()).hexdigest()[:12]
    return tag, f"{tag}.{hashlib.sha256(f'collection:{collection}'.encode()).hexdigest()[:8]}"


def test_an_earlier_releases_conversation_is_moved_under_the_secret_id_when_named(store):
    tag, computable = _before("alice", "acme")
    store.append(f"{computable}:old", turn())
    store.claim("old", tag)  # that release recorded alice as the first to ask in "old"
    stored = stored_session(store, ALICE, "acme", "old")
    assert len(store.load(stored).turns) == 1 and store.load(f"{computable}:old").turns == ()
    assert stored_session(store, ALICE, "acme", "old") == stored  # once


def test_turns_another_wrote_under_a_computable_id_are_never_adopted(store):
    tag, computable = _before("alice", "acme")
    store.append(f"{computable}:planted", turn())  # written there by someone else: no claim names alice
    assert store.load(stored_session(store, ALICE, "acme", "planted")).turns == ()
    store.append(f"{computable}:taken", turn())
    store.claim("taken", _before("bob", "acme")[0])  # claimed by bob in that release
    assert store.load(stored_session(store, ALICE, "acme", "taken")).turns == ()


def test_default_collection_conversations_of_an_earlier_release_are_left_unread(store):
    # There that release's plain keys used ids as stored: turns under alice's computable id may be anyone's.
    tag, computable = _before("alice", "default")
    store.append(f"{computable}:d1", turn())
    store.claim("d1", tag)
    assert store.load(stored_session(store, ALICE, "default", "d1")).turns == ()
    assert len(store.load(f"{computable}:d1").turns) == 1  # left where it is, not deleted


def test_a_new_store_is_its_users_alone(tmp_path):
    s = open_store(tmp_path / "new.sqlite")
    s.close()
    assert (tmp_path / "new.sqlite").stat().st_mode & 0o077 == 0
