"""Conversations: the stored turns and summaries of each session
(``store``), summarising old turns (``summarise``), and the keeper that
remembers turns and folds them in the background (``keeper``)."""

from .keeper import ConversationKeeper, History, kv_key
from .store import Conversation, ConversationStore, Turn, check_session_id

__all__ = ["Conversation", "ConversationKeeper", "ConversationStore", "History", "Turn", "check_session_id", "kv_key"]
