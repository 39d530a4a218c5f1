"""Conversations in PostgreSQL, for several front-ends sharing them.

The same tables, queries and schema version as the SQLite store
(``store.Conversations``); the version lives in a table ``rag_meta``, and
the schema is created, checked or upgraded (``store.upgrade``) under an
advisory lock, so front-ends that start together do not race. A session's
turn lock is a session-level advisory lock held on a connection of its own
for the whole turn, so it is released if its process dies. Selected by a
URL such as ``RAG_CONVERSATIONS=postgresql://user@host/db`` (or
``postgresql:///db?host=/run/postgresql`` for a Unix socket); the database
should be one of its own (the tables are ``sessions``, ``turns``,
``summaries``, ``session_owners``, ``store_secrets`` and ``rag_meta``).

Needs psycopg 3 (``pip install 'rag-budget[postgres]'``).

Does not: create the database or its role, or move conversations between stores.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from ..errors import RagError, redacted
from .store import (SCHEMA_VERSION, Conversations, check_session_id, lock_slot, readable, schema, schema_mismatch,
                    upgrade)

LOCK_CLASS = 0x72616700  # "rag\0": the first key of every advisory lock this store takes
SCHEMA_LOCK = 0  # the second key of the lock held while the schema is created or checked
IDLE_LOCK_CONNECTIONS = 4  # connections kept for turn locks between turns


class _Translated:
    """A psycopg connection taking the queries' ``?`` placeholders."""

    def __init__(self, connection) -> None:
        self._connection = connection

    def execute(self, sql: str, params=()):
        return self._connection.execute(sql.replace("?", "%s"), params)


class PostgresConversations(Conversations):
    """Conversations in the PostgreSQL database at ``url``; a RagError when
    it cannot be reached or holds another schema version."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise RagError("RAG_CONVERSATIONS names a PostgreSQL database, but psycopg is not installed: "
                           "pip install 'rag-budget[postgres]'") from None
        self._psycopg = psycopg
        self.url, self.where = url, redacted(url)
        self._lock = threading.Lock()
        self._idle: list = []  # connections for turn locks
        self._db = self._connect()
        try:
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, SCHEMA_LOCK))
                self._db.execute("CREATE TABLE IF NOT EXISTS rag_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                row = self._db.execute("SELECT value FROM rag_meta WHERE key = 'schema_version'").fetchone()
                if row is not None and not readable(int(row[0])):
                    raise schema_mismatch(self.where, int(row[0]))
                self._db.execute(schema("DOUBLE PRECISION"))
                has_index_id = self._db.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = 'sessions' AND column_name = 'index_id'").fetchone() is not None
                upgrade(self._db, has_index_id=has_index_id)
                self._db.execute("INSERT INTO rag_meta (key, value) VALUES ('schema_version', %s) "
                                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))
        except psycopg.Error as exc:
            self._db.close()
            raise self._refused(exc) from None

    def _connect(self):
        try:
            return self._psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except self._psycopg.Error as exc:
            raise self._refused(exc) from None

    def _refused(self, exc: Exception) -> RagError:
        message = " ".join(str(exc).split())[:300].replace(self.url, self.where)
        return RagError(f"{self.where}: the conversation store cannot be used ({message}); check that the "
                        "database is running and RAG_CONVERSATIONS names it")

    @contextlib.contextmanager
    def _access(self, write: bool = False) -> Iterator[_Translated]:
        """The database under the store's lock (in a transaction when
        ``write``), reconnected once if the connection was lost."""
        psycopg = self._psycopg
        try:
            with self._lock:
                if self._db.closed or self._db.broken:
                    self._db = self._connect()
                if write:
                    with self._db.transaction():
                        yield _Translated(self._db)
                else:
                    yield _Translated(self._db)
        except psycopg.Error as exc:
            raise self._refused(exc) from None

    @contextlib.contextmanager
    def turn_lock(self, session: str, *, blocking: bool = True) -> Iterator[bool]:
        """Hold ``session`` against every process using this database: an
        advisory lock on a connection of its own, for the whole turn."""
        slot = lock_slot(check_session_id(session))
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        try:
            if connection is None or connection.closed or connection.broken:
                connection = self._connect()
            take = "pg_advisory_lock" if blocking else "pg_try_advisory_lock"
            locked = connection.execute(f"SELECT {take}(%s, %s)", (LOCK_CLASS, slot)).fetchone()[0]
        except self._psycopg.Error as exc:
            raise self._refused(exc) from None
        try:
            yield locked is not False
        finally:
            self._release(connection, slot if locked is not False else None)

    def _release(self, connection, slot: int | None) -> None:
        """Unlock ``slot`` and keep the connection for the next turn (or close it)."""
        try:
            if slot is not None:
                connection.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, slot))
        except self._psycopg.Error:
            connection.close()  # closing it releases the lock too
            return
        with self._lock:
            if len(self._idle) < IDLE_LOCK_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        """Close every connection (which releases any lock still held)."""
        with self._lock:
            for connection in (self._db, *self._idle):
                connection.close()
            self._idle.clear()
