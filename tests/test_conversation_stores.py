"""Both conversation stores, SQLite and a real PostgreSQL on a Unix socket,
behave alike: turns survive reopening, folds are one transaction, the schema
version is checked, a store of schema 1 is upgraded and still read, sessions
are listed by the index they belong to, turns stored at once get their own
numbers, a session id has one owner however many claim it at once, and a
session's turn lock holds against another process."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rag.conversations import Turn, open_store
from rag.conversations.postgres import redacted
from rag.conversations.store import SCHEMA_VERSION, schema
from rag.errors import RagError
from rag.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "c.sqlite")
    return request.getfixturevalue("postgres_url")


def turn(n: int) -> Turn:
    return Turn(n, f"question {n}?", f"Context: ...\n\nQuestion: question {n}?", "An answer.", 20,
                ({"source": "a.md"},), {"ttft_s": 0.1})


def test_turns_survive_reopening_and_fold_in_one_transaction(location):
    store = open_store(location)
    for n in (1, 2, 3):
        store.append("s1", turn(n))
    store.close()
    store = open_store(location)  # another process would see the same
    c = store.load("s1")
    assert [t.number for t in c.turns] == [1, 2, 3] and c.turns[0].sources == ({"source": "a.md"},)
    assert store.fold("s1", through=2, summary="Asked 1 and 2.", expected_version=0, method="llm", tokens=5,
                      seconds=0.25)
    assert not store.fold("s1", through=3, summary="stale", expected_version=0, method="llm", tokens=1, seconds=0.1)
    c = store.load("s1")
    assert (c.summary, c.summary_version, c.folded, [t.number for t in c.turns]) == ("Asked 1 and 2.", 1, 2, [3])
    assert store.summaries("s1") == [{"version": 1, "method": "llm", "folded_turns": 2, "tokens": 5, "seconds": 0.25}]
    assert store.sessions()[0]["session"] == "s1" and store.sessions()[0]["turns"] == 3
    store.reset("s1")
    assert store.load("s1").turns == () and store.sessions() == []
    store.close()


def _schema_1_store(location: str) -> None:
    """A store as rag-budget wrote it at schema 1 (sessions without their
    index), holding session "old" with one turn."""
    float_type = "REAL" if not location.startswith("postgresql") else "DOUBLE PRECISION"
    tables = schema(float_type)
    old = tables.replace(",\n    index_id TEXT\n", "\n")
    assert old != tables
    rows = ["INSERT INTO sessions (id, created, updated) VALUES ('old', 1, 1)",
            "INSERT INTO turns (session_id, number, question, prompted, answer, sources, timings, tokens, created) "
            "VALUES ('old', 1, 'q?', 'q?', 'a.', '[]', '{}', 3, 1)"]
    if float_type == "REAL":
        import sqlite3

        db = sqlite3.connect(location)
        db.executescript(old + ";".join(rows) + "; PRAGMA user_version=1;")
        db.close()
        return
    import psycopg

    with psycopg.connect(location, autocommit=True) as db:
        db.execute(old)
        for row in rows:
            db.execute(row)
        db.execute("CREATE TABLE rag_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO rag_meta VALUES ('schema_version', '1')")


def test_a_schema_1_store_is_upgraded_and_sessions_are_listed_by_their_index(location):
    _schema_1_store(location)
    store = open_store(location)
    assert [t.question for t in store.load("old").turns] == ["q?"]  # nothing of it lost
    assert [s["session"] for s in store.sessions()] == ["old"]
    assert store.sessions(index="/srv/a") == []  # belongs to no index yet
    store.append_next("a1", "q", "p", "a", 5, index="/srv/a")
    store.append_next("b1", "q", "p", "a", 5, index="/srv/b")
    store.append_next("a1", "q2", "p", "a", 5, index="/srv/b")  # a session keeps the index it started with
    store.append_next("old", "q2", "p", "a", 5, index="/srv/b")  # continued: it is B's from now on
    store.close()
    store = open_store(location)  # upgraded once: opened again as it is
    assert [s["session"] for s in store.sessions(index="/srv/a")] == ["a1"]
    assert {s["session"] for s in store.sessions(index="/srv/b")} == {"b1", "old"}
    assert {s["session"]: s["turns"] for s in store.sessions()} == {"a1": 2, "b1": 1, "old": 2}
    store.close()
    if location.startswith("postgresql"):
        import psycopg

        with psycopg.connect(location) as db:
            version = db.execute("SELECT value FROM rag_meta WHERE key = 'schema_version'").fetchone()[0]
    else:
        import sqlite3

        db = sqlite3.connect(location)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        db.close()
    assert int(version) == SCHEMA_VERSION == 2


def test_turns_stored_at_once_each_get_their_own_number(location):
    stores = [open_store(location), open_store(location)]  # two front-ends
    errors: list[BaseException] = []

    def add(store, k: int) -> None:
        try:
            for i in range(10):
                store.append_next("busy", f"q{k}.{i}", "p", "a", 5)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(stores[k % 2], k)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    numbers = [t.number for t in stores[0].load("busy").turns]
    assert numbers == list(range(1, 41))
    for store in stores:
        store.close()


def test_a_session_id_has_one_owner_whoever_claims_it_at_once(location):
    stores = [open_store(location), open_store(location)]  # two front-ends sharing the store
    got: list[str] = []
    threads = [threading.Thread(target=lambda k=k: got.append(stores[k % 2].claim("s1", f"owner{k}")))
               for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and len(set(got)) == 1 and got[0].startswith("owner")  # every claimant told the same one
    assert stores[1].owner("s1") == got[0] and stores[0].owner("s2") is None
    stores[0].append("s1", turn(1))
    stores[0].reset("s1")  # forgetting the conversation keeps its id its owner's
    assert stores[1].claim("s1", "someone else") == got[0]
    for store in stores:
        store.close()


HOLDER = """
import sys
from rag.conversations import open_store
store = open_store(sys.argv[1])
with store.turn_lock("shared") as held:
    print("held" if held else "not held", flush=True)
    sys.stdin.readline()
store.close()
"""


def test_a_turn_lock_holds_against_another_process(location):
    store = open_store(location)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, location], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert holder.stdout.readline().strip() == "held"
        with store.turn_lock("shared", blocking=False) as held:
            assert not held
        with store.turn_lock("another", blocking=False) as held:
            assert held  # other sessions go on
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
        with store.turn_lock("shared", blocking=False) as held:
            assert held
    finally:
        holder.kill()
        store.close()


def test_a_postgres_store_of_another_schema_version_is_refused(postgres_url):
    import psycopg

    open_store(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE rag_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(RagError, match="schema version 99"):
        open_store(postgres_url)


def test_an_unreachable_database_is_one_clear_error_without_its_password(tmp_path):
    url = f"postgresql://rag:sekret@/nothing?host={tmp_path}"
    with pytest.raises(RagError, match="cannot be used") as err:
        open_store(url)
    assert "sekret" not in str(err.value) and redacted(url) in str(err.value)
    assert Settings.load(conversations=url).conversations_path == url  # a URL is not taken for a path
