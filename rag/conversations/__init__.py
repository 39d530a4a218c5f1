"""Conversations: the stored turns and summaries of each session
(``store``: SQLite; ``postgres``: PostgreSQL), summarising old turns (``summarise``), and the keeper that
remembers turns and folds them in the background (``keeper``)."""

from .keeper import ConversationKeeper, History, kv_key
from .opening import open_store
from .store import Conversation, Conversations, ConversationStore, Turn, check_session_id

__all__ = ["Conversation", "ConversationKeeper", "ConversationStore", "Conversations", "History", "Turn",
           "check_session_id", "kv_key", "open_store"]
