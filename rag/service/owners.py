"""Whose a conversation is: the service stores each session under an id of
its own for the holder that opened it and the collection it was opened in,
so no caller can read, continue, list or delete another's, and a session
never crosses into another collection.

A stored id is ``<holder tag>.<collection tag>:<session id>``. The holder
tag is an HMAC of the holder under a secret kept in the conversation store
itself (:meth:`Conversations.secret`, drawn at random by the first service
that needs it and shared by every service over the same store), so it
cannot be worked out from a holder's name: knowing alice's name and her
session id tells nothing of where her turns are stored. Every holder has
its tag: each key file holder, the plain ``RAG_SERVE_API_KEYS`` keys (one
holder together, apart from the local user) and the local user in a named
collection. Only the local user (the CLI, MCP over stdio, a service without
keys) keeps bare ids in the default collection, as before holders existed;
an id shaped like a stored one is refused there, so it cannot name a
holder's conversation by its stored id either.

Ids are the caller's own: the same id named by two holders, or by one
holder in two collections, is two conversations, so no one can take an id
from another, lock another out of it, or learn that another uses it.

A key holder's conversations in a named collection stored under the tags
of earlier releases (a SHA-256 of the holder's name, which anyone could
compute) are moved under the secret tag the first time their holder names
them, where that release's claim of the id names the holder
(:func:`_moved_from_before`).

Does not: store conversations (``rag.conversations``) or find the caller (``gate``).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

from ..errors import RagError, SessionNotFound
from ..index.collection_names import DEFAULT_COLLECTION
from .keys import LOCAL_USER, Caller

if TYPE_CHECKING:
    from ..conversations import Conversations

_TAG = 12  # hex digits of a holder's tag; a collection's is 8: 12 + 1 + 8 + 1 ahead of the session id
MAX_OWNED_SESSION = 128 - _TAG - 1 - 8 - 1  # the stored id stays within a session id's 128 characters
SECRET = "session-owners"  # the name of the store's secret the holder tags are made with
PLAIN_KEYS = "plain keys"  # the holder the RAG_SERVE_API_KEYS keys are together
# The local user's own front ends through the resident server's socket (the CLI, MCP): their session ids
# are stored as given, in every collection, as a pipeline in their process stores them; MCP over HTTP has
# already made a key's ids its own (stored_session) before it asks through that socket.
SHELL_USER = Caller("local user (resident)", everything=True)


def _hexdigest(text: str, digits: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:digits]


def holder_of(caller: Caller) -> str:
    """Who ``caller`` is as a conversation's owner: the local user, the
    plain keys (together), or a key file's holder by its name; a holder
    name can never be one of the first two (key files' names hold no space)."""
    if caller == LOCAL_USER:
        return "local:"
    if caller.everything:
        return "plain:" + PLAIN_KEYS
    return "holder:" + caller.holder


def owner_tag(conversations: Conversations, caller: Caller) -> str:
    """``caller``'s tag in ``conversations``: an HMAC of its holder under
    the store's secret, so no one without the store can work it out."""
    secret = conversations.secret(SECRET)
    return hmac.new(secret, holder_of(caller).encode("utf-8"), hashlib.sha256).hexdigest()[:_TAG]


def _collection_tag(collection: str) -> str:
    return _hexdigest("collection:" + collection, 8)


def _bare(caller: Caller, collection: str) -> bool:
    """Whether ``caller``'s ids in ``collection`` are stored bare (the
    local user's in the default collection, its shell's everywhere)."""
    return caller == SHELL_USER or (caller == LOCAL_USER and collection == DEFAULT_COLLECTION)


def _local(caller: Caller) -> bool:
    return caller == LOCAL_USER or caller == SHELL_USER


def _prefix(conversations: Conversations, caller: Caller, collection: str) -> str:
    if _bare(caller, collection):
        return ""
    return f"{owner_tag(conversations, caller)}.{_collection_tag(collection)}:"


def stored_session(conversations: Conversations, caller: Caller, collection: str, session: str | None) -> str | None:
    """The id ``session`` is stored under for ``caller`` in ``collection``
    (None stays None); SessionNotFound for a bare id shaped like another's
    stored id, a RagError for an id too long to carry its owner. A
    conversation the caller held under an earlier release's id is moved
    under this one first."""
    if session is None:
        return None
    prefix = _prefix(conversations, caller, collection)
    if not prefix:
        if _owned(session) and caller != SHELL_USER:  # a stored id of a holder: never reachable by naming it
            raise SessionNotFound(f"no conversation {session}")
        return session
    if len(session) > MAX_OWNED_SESSION:
        raise RagError(f"session id of {len(session)} characters: use at most {MAX_OWNED_SESSION} with a key")
    stored = prefix + session
    _moved_from_before(conversations, caller, collection, session, stored)
    return stored


def asking(conversations: Conversations, caller: Caller, collection: str, session: str | None,
           given_scope: str | None = None) -> tuple[str | None, str]:
    """What a question of ``caller`` in ``collection`` runs as: the id its
    ``session`` is stored under (:func:`stored_session`: nothing claimed,
    no one refused, ids being per holder and collection) and its
    :func:`cache_scope`, or ``given_scope`` where the caller is trusted to
    name it (the resident server's client, answering for MCP's caller)."""
    stored = stored_session(conversations, caller, collection, session)
    return stored, given_scope if given_scope is not None else cache_scope(conversations, caller, collection)


def cache_scope(conversations: Conversations, caller: Caller, collection: str) -> str:
    """Whose cached cells ``caller``'s prompts in ``collection`` may reuse
    beyond the shared system prompt (``AskOptions.cache_scope``): its
    holder tag and the collection's, "" for the local user (its own
    machine's caches are its own)."""
    if _local(caller):
        return ""
    return f"{owner_tag(conversations, caller)}.{_collection_tag(collection)}"


def _before(caller: Caller, collection: str) -> tuple[str, str] | None:
    """The tag an earlier release gave ``caller``, a key file's holder (a
    SHA-256 of its name), and the prefix it stored its ids in a named
    ``collection`` under; None for callers that may do everything (their
    ids were shared) and for the default collection."""
    if caller.everything or collection == DEFAULT_COLLECTION:
        # Not the default collection: there an earlier release's plain keys used ids as stored, so turns
        # under a holder's computable id there may be anyone's; they are left where they are, unread.
        return None
    tag = _hexdigest("holder:" + caller.holder, _TAG)
    return tag, f"{tag}.{_collection_tag(collection)}:"


def _moved_from_before(conversations: Conversations, caller: Caller, collection: str, session: str,
                       stored: str) -> None:
    """Move the conversation an earlier release kept for ``caller`` under
    a computable id to ``stored``, the first time it is named: only where
    that release's claim of the id names ``caller`` (it recorded who first
    asked in each id), so turns another caller wrote under the computable
    id are never adopted; nothing when ``stored`` already holds one."""
    before = _before(caller, collection)
    if before is None:
        return
    tag, prefix = before
    if conversations.owner(session) == tag:
        conversations.rename(prefix + session, stored)


def own_sessions(conversations: Conversations, caller: Caller, collection: str,
                 listed: list[dict[str, object]]) -> list[dict[str, object]]:
    """Those of ``listed`` (the store's sessions) that ``caller`` opened in
    ``collection``, each under the id the caller gave it."""
    prefix = _prefix(conversations, caller, collection)
    if not prefix:  # the local user's own ids: all but those stored for an owner
        return [s for s in listed if not _owned(str(s["session"]))]
    return [s | {"session": str(s["session"])[len(prefix):]} for s in listed if str(s["session"]).startswith(prefix)]


def _owned(stored: str) -> bool:
    """Whether ``stored`` has the shape of an id stored for an owner."""
    head, colon, _ = stored.partition(":")
    tag, dot, ctag = head.partition(".")
    return bool(colon and dot and len(tag) == _TAG and len(ctag) == 8
                and all(c in "0123456789abcdef" for c in tag + ctag))


# Figures of an answer that measure other callers' prompts (the cells every other sequence holds, whether
# the prefill was shared with another's): told to the local user, never to a key's holder.
OTHERS_FIGURES = ("others_cells", "shared_prefill")


def as_seen_by(caller: Caller, answer: dict) -> dict:
    """The answer object (``Answer.to_dict()``) as ``caller`` is shown it:
    its timings' figures of other callers' prompts (:data:`OTHERS_FIGURES`)
    are null for any caller but the local user, as ``/metrics`` is closed
    to keys that may not read every collection."""
    if _local(caller) or "timings" not in answer:
        return answer
    timings = dict(answer["timings"])
    timings.update({name: None for name in OTHERS_FIGURES if name in timings})
    return answer | {"timings": timings}
