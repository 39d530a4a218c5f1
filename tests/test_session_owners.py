"""Whose a session id is (rag/service/owners.py) over a real SQLite
conversation store: stored ids are made with the store's secret, so no
caller can name another's; a holder's first answered question claims an
id in its collection, and another key is refused there; a request that
failed claims nothing; plain keys are a holder of their own; a
conversation stored under an earlier release's computable id is moved
under the secret one when its holder names it."""

from __future__ import annotations

import hashlib

import pytest

from rag.conversations import Turn, open_store
from rag.errors import SessionNotFound
from rag.service.keys import LOCAL_USER, Caller, KeyRing
from rag.service.owners import SHELL_USER, claim_session, continued_session, own_sessions, stored_session

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


def answered(store, caller, collection, session):
    """As the service does: the id resolved, a turn stored, the id claimed."""
    stored = continued_session(store, caller, collection, session)
    store.append_next(stored, "q?", "prompted", "An answer.", 10)
    claim_session(store, caller, collection, session)
    return stored


def test_the_first_holder_answered_claims_an_id_in_its_collection_and_another_key_is_refused(store):
    answered(store, ALICE, "acme", "s1")
    answered(store, ALICE, "default", "s1")
    with pytest.raises(SessionNotFound, match="no conversation s1"):
        continued_session(store, BOB, "acme", "s1")
    assert continued_session(store, BOB, "acme", None) is None
    # The same id in a collection alice never answered in is bob's to take.
    assert continued_session(store, BOB, "board", "s1") == stored_session(store, BOB, "board", "s1")


def test_a_request_that_failed_claims_nothing(store):
    continued_session(store, BOB, "acme", "s2")  # resolved, then the request failed: no turn, no claim
    assert answered(store, ALICE, "acme", "s2") == stored_session(store, ALICE, "acme", "s2")
    with pytest.raises(SessionNotFound):
        continued_session(store, BOB, "acme", "s2")


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
    for caller in (PLAIN, BOB, LOCAL_USER):
        try:
            reached = stored_session(store, caller, "default", stored)
        except SessionNotFound:
            continue  # the local user: an id shaped as a stored one is refused
        assert reached != stored and store.load(reached).turns == ()
    assert own_sessions(store, LOCAL_USER, "default", store.sessions()) == []
    assert own_sessions(store, PLAIN, "default", store.sessions()) == []
    assert [s["session"] for s in own_sessions(store, ALICE, "default", store.sessions())] == ["s1"]


def test_plain_keys_are_a_holder_apart_from_the_local_user(store):
    store.append("mine", turn())  # the local user's, under the bare id
    assert stored_session(store, PLAIN, "default", "mine") != "mine"
    with pytest.raises(SessionNotFound):
        continued_session(store, PLAIN, "default", "mine")  # the local user's conversation is not taken over
    answered(store, PLAIN, "default", "p1")
    with pytest.raises(SessionNotFound):
        continued_session(store, ALICE, "default", "p1")


def test_a_conversation_held_before_claims_stays_its_holders(store):
    # Before ids were claimed, alice and bob could each hold a conversation "support-1" of their own.
    for who in (ALICE, BOB):
        store.append(stored_session(store, who, "acme", "support-1"), turn())
    claim_session(store, ALICE, "acme", "support-1")
    assert continued_session(store, BOB, "acme", "support-1") == stored_session(store, BOB, "acme", "support-1")
    assert continued_session(store, ALICE, "acme", "support-1") == stored_session(store, ALICE, "acme", "support-1")


def test_the_local_user_is_never_locked_out_of_its_own_ids(store):
    answered(store, ALICE, "default", "x")  # a key claims "x" first
    assert continued_session(store, LOCAL_USER, "default", "x") == "x"  # stored apart: nothing of alice's is read
    store.append("x", turn())
    assert len(store.load(stored_session(store, ALICE, "default", "x")).turns) == 1
    assert continued_session(store, SHELL_USER, "acme", "x") == "x"  # the CLI through its resident server: as given


def test_an_earlier_releases_conversation_is_moved_under_the_secret_id_when_named(store):
    computable = f"{hashlib.sha256(b'holder:alice').hexdigest()[:12]}.{hashlib.sha256(b'collection:acme').hexdigest()[:8]}"
    store.append(f"{computable}:old", turn())
    stored = stored_session(store, ALICE, "acme", "old")
    assert len(store.load(stored).turns) == 1 and store.load(f"{computable}:old").turns == ()
    assert stored_session(store, ALICE, "acme", "old") == stored  # once
