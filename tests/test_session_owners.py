"""Whose a session id is (rag/service/owners.py) over a real SQLite
conversation store: the first holder to ask in an id claims it; another
key is refused; a conversation a caller already held before ids were
claimed stays its own, and the local user is never locked out."""

from __future__ import annotations

import pytest

from rag.conversations import Turn, open_store
from rag.errors import SessionNotFound
from rag.service.keys import LOCAL_USER, Caller
from rag.service.owners import continued_session, stored_session

ALICE = Caller("alice", {"acme": "write", "default": "read"})
BOB = Caller("bob", {"*": "read"})


def turn() -> Turn:
    return Turn(1, "q?", "Context: ...\n\nQuestion: q?", "An answer.", 10)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "c.sqlite")
    yield s
    s.close()


def test_the_first_holder_claims_an_id_and_another_key_is_refused(store):
    assert continued_session(store, ALICE, "acme", "s1") == stored_session(ALICE, "acme", "s1")
    assert continued_session(store, ALICE, "default", "s1") == stored_session(ALICE, "default", "s1")
    with pytest.raises(SessionNotFound, match="no conversation s1"):
        continued_session(store, BOB, "acme", "s1")
    assert continued_session(store, BOB, "acme", None) is None


def test_a_conversation_held_before_claims_stays_its_holders(store):
    # Before ids were claimed, alice and bob could each hold a conversation "support-1" of their own.
    for who in (ALICE, BOB):
        store.append(stored_session(who, "acme", "support-1"), turn())
    store.append("mine", turn())  # the local user's, under the bare id
    assert continued_session(store, BOB, "acme", "support-1") == stored_session(BOB, "acme", "support-1")
    assert continued_session(store, ALICE, "acme", "support-1") == stored_session(ALICE, "acme", "support-1")
    with pytest.raises(SessionNotFound):
        continued_session(store, ALICE, "default", "mine")  # the local user's conversation is not taken over


def test_the_local_user_is_never_locked_out_of_its_own_ids(store):
    continued_session(store, ALICE, "default", "x")  # a key claims "x" first
    assert continued_session(store, LOCAL_USER, "default", "x") == "x"  # stored apart: nothing of alice's is read
    store.append("x", turn())
    assert store.load(stored_session(ALICE, "default", "x")).turns == ()
