"""Conversations: the stored turns and summaries of each session
(``store``: SQLite; ``postgres``: PostgreSQL), summarising old turns
(``summarise``), and the memory that remembers turns and folds them in the
background (``memory``).

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"ConversationMemory": ".memory", "History": ".memory", "kv_key": ".memory", "Conversation": ".store",
            "Conversations": ".store", "ConversationStore": ".store", "Turn": ".store",
            "check_session_id": ".store", "index_key": ".store", "open_store": ".opening"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
