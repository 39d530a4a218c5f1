"""The resident server's pure parts: its address (the key over the
settings, the private runtime folder), an answer's JSON read back, and
what the command line saw; no server is started here."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backend import Timings
from rag.cli.seen import STARTUP_WAIT_S, Seen, process_age, run_start
from rag.errors import RagError
from rag.qa.answer import Answer, Budget, BudgetDecision, Source
from rag.resident.address import Address, private_folder, server_settings, settings_key
from rag.settings import Settings


def test_an_answer_reads_back_from_its_json():
    answer = Answer(
        answer="Prefill fills the KV cache [1].",
        sources=(Source("c1", "a.md", 0.61, None, None, "Title > Part"),
                 Source("c2", "q.xlsx", 0.42, None, {"sheet": "Q1", "rows": [2, 9]}, "")),
        budget=Budget(1.5, 1.2, 20, 2, planned_ttft_s=1.4, feasible=True, safety=1.1, cached_tokens=70,
                      decisions=(BudgetDecision("c1", "a.md", 120, 0.61, 0.9, True, None, trimmed=True),
                                 BudgetDecision("c3", "b.md", 900, 0.2, 2.9, False, "ttft"))),
        timings=Timings(300, 70, 230, 1.1, 1.0, 40, 0.4, 1.6, restored_tokens=10, queue_s=0.05),
        session="s-1", turn=2, turns_shown=1)
    wire = json.loads(json.dumps(answer.to_dict()))
    assert Answer.from_dict(wire) == answer
    assert Answer.from_dict(wire | {"new_field": 1}).to_dict() == answer.to_dict()  # a newer server's fields


def test_the_key_is_the_set_up_and_not_what_each_request_carries(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    base = Settings.load(index=tmp_path / "index")
    key = settings_key(base)
    assert settings_key(server_settings(base)) == key  # resolving again changes nothing
    for same in (dict(target_ttft=0.5), dict(retrieval="bm25"), dict(server_idle_s=5), dict(no_server=True),
                 dict(runtime_dir=tmp_path / "elsewhere")):
        assert settings_key(Settings.load(index=tmp_path / "index", **same)) == key, same
    for other in (dict(index=tmp_path / "other"), dict(model=tmp_path / "m.gguf"), dict(kv_type="q8_0"),
                  dict(engine_url="http://127.0.0.1:9"), dict(n_ctx=2048), dict(gpu_layers=0), dict(slots=2),
                  dict(conversations=tmp_path / "c.sqlite"), dict(conversations="postgresql://rag@db/rag")):
        assert settings_key(Settings.load(**({"index": tmp_path / "index"} | other))) != key, other
    monkeypatch.chdir(tmp_path)
    assert settings_key(Settings.load(index=Path("index"))) == key  # a relative path from another folder


def test_the_key_changes_when_the_default_index_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    sample = settings_key(Settings.load())  # no index yet: the sample corpus answers
    live = tmp_path / "data" / "rag-budget" / "index"
    (live / "gen-000001").mkdir(parents=True)
    (live / "CURRENT").write_text("gen-000001\n")
    assert settings_key(Settings.load()) != sample


def test_the_runtime_folder_is_private(tmp_path):
    folder = private_folder(tmp_path / "run")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    os.chmod(folder, 0o755)
    private_folder(folder)  # ours but too open: closed, not refused
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (tmp_path / "file").write_text("x")
    with pytest.raises(RagError, match="not a folder of yours"):
        private_folder(tmp_path / "file")


def test_a_socket_path_too_long_is_refused_with_what_to_do(tmp_path):
    deep = tmp_path / ("d" * 120)
    with pytest.raises(RagError, match="RAG_RUNTIME_DIR"):
        Address.of(Settings.load(runtime_dir=deep))


def test_a_fresh_address_has_no_server(tmp_path):
    address = Address.of(Settings.load(runtime_dir=tmp_path / "run"))
    assert not address.alive() and address.pid() is None
    assert address.socket.name == f"{address.key}.sock" and address.socket.parent == tmp_path / "run"


def test_what_the_command_line_saw():
    seen = Seen(started=10.0, via="server", server_pid=42)
    assert seen.to_dict() == {"ttft_s": None, "total_s": None, "via": "server", "server_pid": 42, "evidence_s": None}
    seen.first_text, seen.ended = 10.5, 11.25
    seen.text_shown()  # only the first text stops the clock
    assert seen.to_dict() == {"ttft_s": 0.5, "total_s": 1.25, "via": "server", "server_pid": 42, "evidence_s": None}
    age = process_age()
    assert age is not None and age > 0  # Linux: read from /proc/self/stat


def test_the_clock_starts_at_the_process_unless_it_ran_another_command_first():
    # Forked 0.2 s before rag's first line, 0.15 s of it CPU: the interpreter starting.
    assert run_start(10.2, (100.0, 0.15), (110.0, 0.5)) == pytest.approx(99.8)
    # Forked 1041 s before: the shell ran `pip install` in this process first.
    assert run_start(1041.0, (1040.0, 0.1), (1041.5, 0.3)) == 1040.0
    assert run_start(None, (5.0, 0.1), (6.0, 0.2)) == 5.0
    # Some waiting for a busy CPU is still start-up.
    assert run_start(STARTUP_WAIT_S, (0.1, 0.05), (0.1, 0.1)) == pytest.approx(0.1 - STARTUP_WAIT_S)


def test_a_shell_line_before_rag_is_not_counted_as_waiting_for_it():
    """``bash -c "sleep 3 && rag ..."``: the last command runs in the shell's
    own process, forked 3 s before rag began; the clock starts with rag."""
    # The probe also prints how long the interpreter waited (not computed) before rag's first line.
    probe = ("import time; import rag; from rag.cli.seen import clock, process_age; clock.process_started(); "
             "now = time.perf_counter(); forked = now - process_age(); "
             "print(time.perf_counter() - clock.started, time.perf_counter() - rag.CODE_STARTED[0], "
             "rag.CODE_STARTED[0] - forked - rag.CODE_STARTED[1])")
    line = f"sleep 3 && exec {sys.executable} -c '{probe}'"
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout.split()
    waited, since_code = float(out[0]), float(out[1])
    assert waited < 3.0 and waited == pytest.approx(since_code, abs=0.01)
    alone = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    waited, since_code, interpreter_waited = map(float, alone)
    assert waited >= since_code - 0.01  # never later than rag's first line
    # Its own process: the interpreter's start-up counts too, where it waited for the machine less than
    # STARTUP_WAIT_S (10 ms aside: the ticks of the process's age). A machine busier than that cannot
    # tell a start-up from another command, and the clock starts with rag: correct either way.
    if interpreter_waited < STARTUP_WAIT_S - 0.01:
        assert waited > since_code


def test_asking_whether_a_server_lives_never_keeps_a_server_from_starting(tmp_path):
    # alive() used to take the very lock a starting server takes: a client asking at that moment
    # made the server think another one lived (it exited), and two clients asking at once saw one.
    import fcntl
    import threading
    import time

    from rag.resident.address import held

    address = Address.of(Settings.load(runtime_dir=tmp_path / "run"))
    address.folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(address.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another client's alive() in progress
        assert not address.alive()

        def done_asking():
            time.sleep(0.2)
            fcntl.flock(fd, fcntl.LOCK_UN)

        threading.Thread(target=done_asking).start()
        with held(address.lock, patience_s=5) as server:  # a server starting meanwhile
            assert server is not None
            assert address.alive()
    finally:
        os.close(fd)
