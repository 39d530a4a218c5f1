"""Whose a conversation is: the service stores each session under an id of
its own for the key that opened it and the collection it was opened in, so
one key can neither read, continue, list nor delete another's, and a
session never crosses into another collection.

A session id is claimed by the holder that first asks in it
(:func:`continued_session`): another key that asks in it is told there is
no conversation of that id (404), and nothing of the first is read. That
404 tells the other key only that the id is in use, never by whom or what
it holds; ids drawn at random (as the page draws them) tell nothing. The
local user (no keys) and plain API keys, which may do everything, are one
holder, keep today's ids in the default collection, and are never refused
(their conversations are stored apart from every key's).

Does not: store conversations (``rag.conversations``) or find the caller (``gate``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ..errors import RagError, SessionNotFound
from ..index.collection_names import DEFAULT_COLLECTION
from .keys import LOCAL_USER, Caller

if TYPE_CHECKING:
    from ..conversations import Conversations

_TAG = 12  # hex digits of a holder's tag; a collection's is 8: 12 + 1 + 8 + 1 ahead of the session id
MAX_OWNED_SESSION = 128 - _TAG - 1 - 8 - 1  # the stored id stays within a session id's 128 characters


def _tag(text: str, digits: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:digits]


def owner_tag(caller: Caller) -> str:
    """Who ``caller`` is as a session's owner: its holder's tag (one for
    every caller that may do everything)."""
    return _tag("holder:" + ("" if caller.everything else caller.holder), _TAG)


_EVERYONE = owner_tag(LOCAL_USER)  # the owner tag of the callers that may do everything


def _prefix(caller: Caller, collection: str) -> str:
    if caller.everything and collection == DEFAULT_COLLECTION:
        return ""
    return f"{owner_tag(caller)}.{_tag('collection:' + collection, 8)}:"


def stored_session(caller: Caller, collection: str, session: str | None) -> str | None:
    """The id ``session`` is stored under for ``caller`` in ``collection``
    (None stays None); a RagError for an id too long to carry its owner."""
    if session is None:
        return None
    prefix = _prefix(caller, collection)
    if prefix and len(session) > MAX_OWNED_SESSION:
        raise RagError(f"session id of {len(session)} characters: use at most {MAX_OWNED_SESSION} with a key")
    return prefix + session


def continued_session(conversations: Conversations, caller: Caller, collection: str, session: str | None) -> str | None:
    """The id ``session`` is stored under for ``caller`` in ``collection``
    (as :func:`stored_session`), once the id is known to be the caller's:
    claimed now if no one has used it, SessionNotFound if another holder
    did. A conversation the caller already holds under it (one from before
    ids were claimed) stays the caller's; so does one the local user holds
    under the bare id. Callers that may do everything are never refused:
    their conversations are stored apart from every key's, so none of a
    key's is read, and the local user is not locked out of its own ids."""
    stored = stored_session(caller, collection, session)
    if session is None:
        return None
    mine = owner_tag(caller)
    owner = conversations.owner(session)
    if owner is None:
        owner = conversations.claim(session, mine if _holds(conversations, stored) or not _holds(
            conversations, session) else _EVERYONE)  # the bare id's turns: the local user's, before claims
    if owner != mine and not caller.everything and not _holds(conversations, stored):
        raise SessionNotFound(f"no conversation {session} for this key: choose another session id")
    return stored


def _holds(conversations: Conversations, stored: str) -> bool:
    """Whether the store holds turns (or a summary of them) under ``stored``."""
    earlier = conversations.load(stored)
    return bool(earlier.turns or earlier.folded)


def own_sessions(caller: Caller, collection: str, listed: list[dict[str, object]]) -> list[dict[str, object]]:
    """Those of ``listed`` (the store's sessions) that ``caller`` opened in
    ``collection``, each under the id the caller gave it."""
    prefix = _prefix(caller, collection)
    if not prefix:  # everything's own ids: all but those stored for an owner or another collection
        return [s for s in listed if not _owned(str(s["session"]))]
    return [s | {"session": str(s["session"])[len(prefix):]} for s in listed if str(s["session"]).startswith(prefix)]


def _owned(stored: str) -> bool:
    head, colon, _ = stored.partition(":")
    tag, dot, ctag = head.partition(".")
    return bool(colon and dot and len(tag) == _TAG and len(ctag) == 8
                and all(c in "0123456789abcdef" for c in tag + ctag))
