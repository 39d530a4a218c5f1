"""Conversations kept by session id: the summary of older turns and the
recent turns as they were prompted.

One interface, :class:`Conversations`, whose queries are written once, and
two stores: :class:`ConversationStore` in a SQLite file (the default) and
``postgres.PostgresConversations`` in a PostgreSQL database, which several
front-ends on several hosts can share; ``opening.open_store`` picks by location.

A turn is stored once its answer is complete; folding older turns into the
summary replaces the summary and marks those turns folded in one
transaction, so a crash leaves either the old or the new history, never a
mix. Summarisation times are recorded apart from answer times. Both stores
carry a schema version and refuse another (a store of an older version is
upgraded in place: :func:`upgrade`). :meth:`Conversations.turn_lock`
holds one session across processes (SQLite: a byte-range lock on a file
beside the database; PostgreSQL: an advisory lock), so front-ends sharing a
store answer a conversation's questions one at a time.

The service's holders are tagged with a secret the store keeps
(:meth:`Conversations.secret`, the table ``store_secrets``), so a stored id
cannot be worked out from a holder's name. The table ``session_owners``
holds who first asked in each id under an earlier release
(:meth:`Conversations.claim`, :meth:`Conversations.owner`): it is read to
move that release's conversations to their holders, and nothing new is
claimed (ids are per holder and collection: ``rag.service.owners``).

Each session records the index it was started against (:func:`index_key`),
so one store shared by front-ends over several indexes lists each index's
conversations apart (:meth:`Conversations.sessions`).

Does not: decide when to fold (``prompt_budget.history``) or summarise
(``summarise``).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Iterator

from ..errors import RagError, redacted
from ..paths import is_database_url

SCHEMA_VERSION = 2  # 2: sessions.index_id, the index a session belongs to
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created {float} NOT NULL,
    updated {float} NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    summary_version INTEGER NOT NULL DEFAULT 0,
    index_id TEXT
);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    question TEXT NOT NULL,
    prompted TEXT NOT NULL,
    answer TEXT NOT NULL,
    sources TEXT NOT NULL,
    timings TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    folded INTEGER NOT NULL DEFAULT 0,
    created {float} NOT NULL,
    PRIMARY KEY (session_id, number)
);
CREATE TABLE IF NOT EXISTS summaries (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    method TEXT NOT NULL,
    folded_turns INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    seconds {float} NOT NULL,
    created {float} NOT NULL,
    PRIMARY KEY (session_id, version)
);
CREATE TABLE IF NOT EXISTS session_owners (
    session TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created {float} NOT NULL
);
CREATE TABLE IF NOT EXISTS store_secrets (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def schema(float_type: str) -> str:
    """The tables, with ``float_type`` for seconds and times (SQLite's REAL
    is 8 bytes; PostgreSQL's is 4, so it gets DOUBLE PRECISION)."""
    return _SCHEMA.format(float=float_type)


def readable(version: int) -> bool:
    """Whether a store of schema ``version`` (0: a new one) can be opened:
    this version, or an older one :func:`upgrade` brings to it."""
    return 0 <= version <= SCHEMA_VERSION


def upgrade(db, *, has_index_id: bool) -> None:
    """Bring the tables of a store to :data:`SCHEMA_VERSION` through
    ``db.execute``, once :func:`schema` ran, in the transaction that does:
    version 1 lacked ``sessions.index_id`` (``has_index_id``: whether it is
    there), added empty (NULL) for the sessions already stored, which keep
    every turn and are still read by :meth:`Conversations.load`."""
    if not has_index_id:
        db.execute("ALTER TABLE sessions ADD COLUMN index_id TEXT")
    db.execute("CREATE INDEX IF NOT EXISTS sessions_by_index ON sessions (index_id, updated)")


def schema_mismatch(where: str, version: int) -> RagError:
    """The error for a store written with another schema version."""
    return RagError(
        f"{where} holds conversations of schema version {version}; this rag-budget reads "
        f"version {SCHEMA_VERSION}. Point RAG_CONVERSATIONS elsewhere or upgrade rag-budget"
    )


def index_key(index_location: str | os.PathLike[str]) -> str:
    """What a session records as the index it belongs to: the index
    folder's absolute path, known before the index is first built (a
    server may start with none) and kept across rebuilds in place.

    ``index_key("idx")`` -> ``"/home/me/idx"`` when run in /home/me; a
    database index is its URL without the password.
    """
    if is_database_url(index_location):
        return redacted(str(index_location))
    return str(Path(index_location).resolve())


def lock_slot(session: str) -> int:
    """A 31-bit number for ``session``, the same in every process: where its turn lock lives."""
    return int.from_bytes(hashlib.sha256(session.encode("utf-8")).digest()[:4], "big") >> 1


def valid_session_id(session: object) -> bool:
    """Whether ``session`` is a usable id (see :func:`check_session_id`)."""
    return isinstance(session, str) and bool(_SESSION_ID.match(session))


def check_session_id(session: str) -> str:
    """``session`` if it is a usable id (letters, digits and ``._:@-``, at
    most 128 characters), else a RagError saying so."""
    if not valid_session_id(session):
        raise RagError(
            f"session id {session!r} is not usable: use 1-128 letters, digits or ._:@- , starting with a letter or digit"
        )
    return session


@dataclass(frozen=True)
class Turn:
    """One answered question of a conversation. ``prompted`` is the user
    message exactly as it went into the prompt (passages included);
    ``tokens`` what the turn takes when replayed (user and answer)."""

    number: int
    question: str
    prompted: str
    answer: str
    tokens: int
    sources: tuple[dict, ...] = ()
    timings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Conversation:
    """A session's summary (and its version, bumped by each fold) and its
    turns not yet folded into it, oldest first."""

    session: str
    summary: str = ""
    summary_version: int = 0
    turns: tuple[Turn, ...] = ()
    folded: int = 0  # turns folded into the summary so far

    @property
    def next_number(self) -> int:
        """The number the next turn gets."""
        return (self.turns[-1].number if self.turns else self.folded) + 1


class Conversations(abc.ABC):
    """The conversation store's interface and its queries, written once.
    A store gives :meth:`_access` (its database, in a transaction when
    writing, errors as RagError), :meth:`turn_lock` and :meth:`close`;
    the queries use ``?`` placeholders."""

    where = "the conversation store"

    @abc.abstractmethod
    def _access(self, write: bool = False) -> ContextManager:
        """The database, under the store's lock (in a transaction when
        ``write``): an object whose ``execute(sql, params)`` returns a
        cursor; its errors leave as RagError."""

    @abc.abstractmethod
    def turn_lock(self, session: str, *, blocking: bool = True) -> ContextManager[bool]:
        """Hold ``session`` against other processes sharing this store, from
        reading its history to storing its answer; yields whether it is held
        (always, when ``blocking``). Threads of one process are kept apart by
        the caller (``ConversationMemory.turn``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the database."""

    def load(self, session: str) -> Conversation:
        """The conversation ``session`` (empty if it has no turns yet)."""
        check_session_id(session)
        with self._access() as db:
            row = db.execute(
                "SELECT summary, summary_version FROM sessions WHERE id = ?", (session,)
            ).fetchone()
            if row is None:
                return Conversation(session)
            rows = db.execute(
                "SELECT number, question, prompted, answer, tokens, sources, timings, folded FROM turns "
                "WHERE session_id = ? ORDER BY number", (session,)
            ).fetchall()
        turns = tuple(
            Turn(n, q, p, a, t, tuple(json.loads(s)), json.loads(tm)) for n, q, p, a, t, s, tm, f in rows if not f
        )
        folded = sum(1 for r in rows if r[7])
        return Conversation(session, row[0], row[1], turns, folded)

    def append(self, session: str, turn: Turn, *, index: str | None = None) -> None:
        """Store an answered turn at the end of ``session`` under its own
        number; ``index``: see :meth:`append_next`."""
        self._insert(session, turn.number, turn, index)

    def append_next(self, session: str, question: str, prompted: str, answer: str, tokens: int,
                    sources: tuple[dict, ...] = (), timings: dict | None = None, *, index: str | None = None) -> int:
        """Store an answered turn as the next of ``session`` and return its
        number, chosen in the same transaction, so turns stored at once by
        several threads or processes each get their own. ``index``
        (:func:`index_key`) is recorded as the session's index when the
        session has none yet (its first turn, or a session stored before
        indexes were recorded); a session keeps the index it started with."""
        return self._insert(session, None, Turn(0, question, prompted, answer, tokens, sources, timings or {}), index)

    def _insert(self, session: str, number: int | None, turn: Turn, index: str | None) -> int:
        check_session_id(session)
        now = time.time()
        with self._access(write=True) as db:
            db.execute(
                "INSERT INTO sessions (id, created, updated, index_id) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET updated = excluded.updated, "
                "index_id = COALESCE(sessions.index_id, excluded.index_id)", (session, now, now, index)
            )
            if number is None:
                number = db.execute(
                    "SELECT COALESCE(MAX(number), 0) + 1 FROM turns WHERE session_id = ?", (session,)
                ).fetchone()[0]
            db.execute(
                "INSERT INTO turns (session_id, number, question, prompted, answer, sources, timings, tokens, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session, number, turn.question, turn.prompted, turn.answer,
                 json.dumps(list(turn.sources)), json.dumps(turn.timings), turn.tokens, now),
            )
        return int(number)

    def fold(
        self, session: str, *, through: int, summary: str, expected_version: int,
        method: str, tokens: int, seconds: float,
    ) -> bool:
        """Replace the summary with ``summary`` and mark turns up to number
        ``through`` folded, if the summary is still at ``expected_version``
        (else another fold won, and nothing changes: returns False)."""
        now = time.time()
        with self._access(write=True) as db:
            cur = db.execute(
                "UPDATE sessions SET summary = ?, summary_version = summary_version + 1, updated = ? "
                "WHERE id = ? AND summary_version = ?", (summary, now, session, expected_version)
            )
            if cur.rowcount != 1:
                return False
            db.execute(
                "UPDATE turns SET folded = 1 WHERE session_id = ? AND number <= ?", (session, through)
            )
            folded = db.execute(
                "SELECT COUNT(*) FROM turns WHERE session_id = ? AND folded = 1", (session,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO summaries (session_id, version, method, folded_turns, tokens, seconds, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (session, expected_version + 1, method, folded, tokens, seconds, now)
            )
        return True

    def summaries(self, session: str) -> list[dict[str, object]]:
        """Every fold of ``session``: version, method (llm or extractive),
        turns folded in all, summary tokens and seconds it took."""
        with self._access() as db:
            rows = db.execute(
                "SELECT version, method, folded_turns, tokens, seconds FROM summaries WHERE session_id = ? "
                "ORDER BY version", (session,)
            ).fetchall()
        return [dict(zip(("version", "method", "folded_turns", "tokens", "seconds"), r)) for r in rows]

    def reset(self, session: str) -> None:
        """Forget ``session``: its turns, summary and summaries."""
        check_session_id(session)
        with self._access(write=True) as db:
            db.execute("DELETE FROM sessions WHERE id = ?", (session,))

    def owner(self, session: str) -> str | None:
        """Who claimed the session id ``session`` (an owner's tag, as
        :meth:`claim` recorded it), or None if no one has."""
        with self._access() as db:
            row = db.execute("SELECT owner FROM session_owners WHERE session = ?", (session,)).fetchone()
        return None if row is None else str(row[0])

    def claim(self, session: str, owner: str) -> str:
        """The owner of the session id ``session``: the one recorded, or
        else ``owner``, recorded now. Two callers claiming at once, from
        any process sharing the store, get the same one (the first)."""
        check_session_id(session)
        with self._access(write=True) as db:
            db.execute("INSERT INTO session_owners (session, owner, created) VALUES (?, ?, ?) "
                       "ON CONFLICT(session) DO NOTHING", (session, owner, time.time()))
            return str(db.execute("SELECT owner FROM session_owners WHERE session = ?", (session,)).fetchone()[0])

    def secret(self, name: str) -> bytes:
        """The store's secret ``name`` (32 random bytes), drawn by the first
        process that asks and the same for every process sharing the store
        (two drawing at once: the first written stands); kept in memory once read."""
        kept: dict[str, bytes] = self.__dict__.setdefault("_secrets", {})  # the stores have no common __init__
        if name in kept:
            return kept[name]
        with self._access(write=True) as db:
            db.execute("INSERT INTO store_secrets (name, value) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                       (name, secrets.token_hex(32)))
            value = bytes.fromhex(str(db.execute("SELECT value FROM store_secrets WHERE name = ?",
                                                 (name,)).fetchone()[0]))
        kept[name] = value
        return value

    def rename(self, old: str, new: str) -> bool:
        """Move the conversation ``old`` (its turns, summary and summaries)
        to the id ``new``, in one transaction; False, and nothing moved, when
        ``old`` holds none or ``new`` holds one already."""
        check_session_id(old)
        check_session_id(new)
        with self._access() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (old,)).fetchone() is None:
                return False  # the usual case, read without a write transaction
        with self._access(write=True) as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (new,)).fetchone() is not None:
                return False
            moved = db.execute(
                "INSERT INTO sessions (id, created, updated, summary, summary_version, index_id) "
                "SELECT ?, created, updated, summary, summary_version, index_id FROM sessions WHERE id = ?",
                (new, old)).rowcount
            if moved != 1:
                return False
            db.execute("UPDATE turns SET session_id = ? WHERE session_id = ?", (new, old))
            db.execute("UPDATE summaries SET session_id = ? WHERE session_id = ?", (new, old))
            db.execute("DELETE FROM sessions WHERE id = ?", (old,))
        return True

    def sessions(self, index: str | None = None) -> list[dict[str, object]]:
        """Every session id with its turn count and last update, newest
        first; with ``index`` (:func:`index_key`), only the sessions recorded
        under that index. A session stored before indexes were recorded
        belongs to none until its next turn records one, so only the
        unfiltered list holds it."""
        where, params = ("WHERE s.index_id = ? ", (index,)) if index is not None else ("", ())
        with self._access() as db:
            rows = db.execute(
                "SELECT s.id, s.updated, COUNT(t.number) FROM sessions s LEFT JOIN turns t ON t.session_id = s.id "
                f"{where}GROUP BY s.id, s.updated ORDER BY s.updated DESC", params
            ).fetchall()
        return [{"session": r[0], "updated": r[1], "turns": r[2]} for r in rows]


class ConversationStore(Conversations):
    """Conversations in one SQLite file, safe to share between threads and
    processes (WAL journal, one connection per store); turn locks in the
    file ``<name>.turns`` beside it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                # Conversations, and the secret their holders' ids are made with: the user's alone. SQLite
                # gives its -wal and -shm files the database's mode.
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            checked = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if checked != "ok":
                raise sqlite3.DatabaseError(f"damaged: {checked}")
            self._db.execute("BEGIN IMMEDIATE")  # one process creates or upgrades the tables at a time
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if not readable(version):
                    raise schema_mismatch(str(self.path), version)
                for statement in schema("REAL").split(";"):  # not executescript: it would commit first
                    if statement.strip():
                        self._db.execute(statement)
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(sessions)")}
                upgrade(self._db, has_index_id="index_id" in columns)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                self._db.commit()
            except BaseException:
                self._db.rollback()
                raise
        except sqlite3.DatabaseError as exc:
            raise self._refused(exc) from None
        self._lock = threading.Lock()
        self.where = str(self.path)
        self._turns_fd: int | None = None

    def _refused(self, exc: Exception) -> RagError:
        # Conversations are the user's data: a damaged store is never deleted or rewritten.
        return RagError(
            f"{self.path}: the conversation store cannot be read ({exc}); it is left as it is: move it aside, "
            "or point RAG_CONVERSATIONS at another file, to start a new one"
        )

    @contextlib.contextmanager
    def _access(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The database under the store's lock (in a transaction when
        ``write``), its errors as RagError."""
        try:
            with self._lock:
                if write:
                    with self._db:
                        yield self._db
                else:
                    yield self._db
        except sqlite3.DatabaseError as exc:
            raise self._refused(exc) from None

    @contextlib.contextmanager
    def turn_lock(self, session: str, *, blocking: bool = True) -> Iterator[bool]:
        """Hold ``session`` against other processes: an exclusive lock on
        one byte of ``<name>.turns`` (the byte of its :func:`lock_slot`)."""
        with self._lock:
            if self._turns_fd is None:
                self._turns_fd = os.open(self.path.with_name(self.path.name + ".turns"), os.O_RDWR | os.O_CREAT, 0o600)
            fd = self._turns_fd
        slot = lock_slot(check_session_id(session))
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB), 1, slot)
        except OSError:
            yield False  # another process holds it (only when not blocking)
            return
        try:
            yield True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, slot)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
            if self._turns_fd is not None:
                os.close(self._turns_fd)  # releases this process's turn locks
                self._turns_fd = None


