"""Which conversation store a location names: a PostgreSQL URL, else a SQLite file.

Does not: create databases or move conversations between stores.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..paths import is_database_url
from .store import Conversations, ConversationStore


def open_store(location: str | os.PathLike[str]) -> Conversations:
    """The conversation store at ``location``: a PostgreSQL URL
    (``postgresql://...``), else a SQLite file path."""
    if is_database_url(location):
        from .postgres import PostgresConversations

        return PostgresConversations(str(location))
    return ConversationStore(Path(location))
