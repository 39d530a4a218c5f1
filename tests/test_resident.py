"""The resident server for real: ``rag`` commands as new processes, each
reaching (or starting) a server process over its Unix socket, with the real
model. Every test runs in a runtime folder of its own under /tmp (short:
socket paths are limited to 107 bytes), never the user's, and stops every
server it started. No timing is asserted."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rag.resident.address import Address
from rag.resident.wire import call

from .answer_contract import missing_fields
from .conftest import assert_clean_error, write_corpus

ROOT = Path(__file__).resolve().parent.parent
RAG = [sys.executable, "-m", "rag.cli"]
LONG = 600  # seconds a command may take here: a first start loads torch and the model on 2 busy cores


def shell(**variables: str) -> dict[str, str]:
    """The environment of a new shell with a runtime folder of its own."""
    env = dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp(prefix="rr-", dir="/tmp"), PYTHONPATH=str(ROOT),
               **variables)
    env.pop("RAG_NO_SERVER")  # conftest answers in process; these tests mean the server
    return env


def rag(env: dict, *args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(RAG + [str(a) for a in args], env=env, input=stdin, capture_output=True, text=True,
                          timeout=LONG, cwd=ROOT)


def servers(env: dict, index: Path) -> list[dict]:
    done = rag(env, "server", "status", "--index", index, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["servers"]


def stop_every_server(env: dict) -> None:
    """``rag server stop --all``, then SIGKILL for any server that did not
    stop; the runtime folder removed."""
    rag(env, "server", "stop", "--all")
    folder = Path(env["XDG_RUNTIME_DIR"]) / "rag-budget"
    for lock in folder.glob("*.lock"):
        address = Address(folder, lock.stem)
        if address.alive() and address.pid():
            os.kill(address.pid(), signal.SIGKILL)
    shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def eventually(check, what: str, within_s: float = LONG) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def index(tmp_path_factory, embedder) -> Path:
    from rag import Pipeline

    root = tmp_path_factory.mktemp("resident")
    pipeline = Pipeline.open(root / "index", embedder=embedder)
    pipeline.ingest([write_corpus(root / "corpus")])
    pipeline.close()
    return root / "index"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One shell's environment for the tests that share its server."""
    variables = shell(RAG_CONVERSATIONS=str(tmp_path_factory.mktemp("conv") / "c.sqlite"))
    yield variables
    stop_every_server(variables)


def ask_json(env: dict, index: Path, question: str, *extra: object) -> dict:
    done = rag(env, "ask", question, "--index", index, "--max-tokens", "12", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_shells_at_once_start_one_server_and_later_asks_reuse_it(env, index):
    questions = ["How long should bread dough rise?", "What limits decode?"]
    # No target: two questions at once on a server just started may otherwise plan their passages away
    # (each waits behind the other), and which one does depends on how fast the machine is.
    started = [subprocess.Popen(RAG + ["ask", q, "--index", str(index), "--max-tokens", "12", "--target-ttft", "none",
                                       "--json"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
               for q in questions]
    outputs = [p.communicate(timeout=LONG) for p in started]
    assert [p.returncode for p in started] == [0, 0], [err for _, err in outputs]
    answers = [json.loads(out) for out, _ in outputs]
    assert answers[0]["sources"] and answers[0]["sources"][0]["source"] == "guide/cooking.rst", answers[0]
    assert answers[1]["answer"]
    pids = {a["cli"]["server_pid"] for a in answers}
    assert len(pids) == 1 and {a["cli"]["via"] for a in answers} == {"server"}
    (running,) = servers(env, index)  # one server, not two
    assert running["pid"] in pids and running["requests"] == 2 and not running["sample"]

    third = ask_json(env, index, "What is prefill?")
    (after,) = servers(env, index)
    assert third["cli"]["server_pid"] == after["pid"] == running["pid"]  # no new process, no new model load
    assert after["requests"] == 3 and after["started_at"] == running["started_at"]


def test_the_client_path_imports_neither_torch_nor_llama_cpp(env, index):
    rag(env, "server", "start", "--index", index)
    done = subprocess.run([sys.executable, "-X", "importtime"] + RAG[1:] + [
        "ask", "What is prefill?", "--index", str(index), "--max-tokens", "4"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=LONG)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "rag.resident.client" in imported and "http.client" in imported
    for heavy in ("torch", "sentence_transformers", "transformers", "llama_cpp", "faiss", "numpy", "fastapi",
                  "httpx", "rag.qa.pipeline"):
        assert heavy not in imported, heavy


def test_output_and_json_are_the_same_as_in_process(env, index, run):
    served = rag(env, "ask", "What limits decode?", "--index", index, "--max-tokens", "16", "-k", "2", "--explain")
    assert served.returncode == 0, served.stderr
    answer, _, sources = served.stdout.partition("Sources")
    assert answer.strip() and "[1] decode.txt" in sources
    assert "budget decision" in sources and "measured" in sources
    assert "TTFT" in served.stderr and "seen" in served.stderr  # the footer, with what the command saw

    by_server = ask_json(env, index, "What does prefill do?", "--explain")
    in_process = run("ask", "What does prefill do?", "--index", index, "--max-tokens", "12", "--json", "--no-server")
    assert in_process.exit_code == 0, in_process.output
    local = json.loads(in_process.stdout)

    assert missing_fields(local) == [] and missing_fields(by_server) == []  # the whole contract, both ways
    for part in (None, "budget", "timings", "cli"):
        assert set(by_server[part] if part else by_server) == set(local[part] if part else local), part
    assert set(by_server["sources"][0]) == set(local["sources"][0])
    assert set(by_server["budget"]["decisions"][0]) == set(local["budget"]["decisions"][0])
    assert (by_server["cli"]["via"], local["cli"]["via"]) == ("server", "process")
    assert local["cli"]["server_pid"] is None and by_server["cli"]["ttft_s"] > 0


def test_search_and_errors_are_the_same_as_in_process(env, index, run):
    served = rag(env, "search", "tomatoes need sun", "--index", index, "-k", "2", "--json")
    assert served.returncode == 0, served.stderr
    local = run("search", "tomatoes need sun", "--index", index, "-k", "2", "--json", "--no-server")
    remote, here = json.loads(served.stdout)["results"], json.loads(local.stdout)["results"]
    assert [{k: v for k, v in r.items() if k != "score"} for r in remote] == \
        [{k: v for k, v in r.items() if k != "score"} for r in here]
    assert [r["score"] for r in remote] == pytest.approx([r["score"] for r in here], abs=1e-5)

    bad = ("ask", "x", "--index", index, "--source", "nothing/**", "--max-tokens", "4")
    by_server, in_process = rag(env, *bad), run(*bad, "--no-server")
    assert_clean_error(in_process, "nothing/**")
    assert by_server.returncode == 1 and "Traceback" not in by_server.stderr
    assert [l for l in by_server.stderr.splitlines() if l.startswith("error:")] == \
        [l for l in in_process.stderr.splitlines() if l.startswith("error:")]


def test_the_server_sees_what_another_shell_ingests(env, index, run, tmp_path):
    rag(env, "server", "start", "--index", index)
    new = write_corpus(tmp_path / "more", {"alpacas.md": "Alpacas grow fine fleece that is shorn every spring."})
    assert run("ingest", new, "--index", index).exit_code == 0  # in another process than the server
    found = rag(env, "search", "alpaca fleece shorn", "--index", index, "-k", "1", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["source"] == "alpacas.md"


def test_chat_through_the_server(env, index):
    script = "How long should dough rise?\nAnd at what temperature?\n/sources\n/stats\n/reset\n/quit\n"
    done = rag(env, "chat", "--index", index, "--session", "rchat-1", "--max-tokens", "12", stdin=script)
    assert done.returncode == 0, done.stderr
    assert "guide/cooking.rst" in done.stdout  # /sources
    assert "cached/prompt tokens" in done.stdout and "TTFT seen" in done.stdout  # /stats
    assert "session rchat-1 forgotten" in done.stderr
    again = rag(env, "chat", "--index", index, "--session", "rchat-1", stdin="/quit\n")
    assert "resuming" not in again.stderr  # /reset forgot it on the server
    kept = rag(env, "chat", "--index", index, "--session", "rchat-2", "--max-tokens", "8", stdin="What is prefill?\n")
    assert kept.returncode == 0, kept.stderr
    resumed = rag(env, "chat", "--index", index, "--session", "rchat-2", stdin="/quit\n")
    assert "resuming after 1 turns" in resumed.stderr


def test_ctrl_c_stops_the_answer_on_the_server(env, index):
    process = subprocess.Popen(RAG + ["ask", "Explain prefill and decode in detail.", "--index", str(index),
                                      "--max-tokens", "400", "--session", "gone-1"],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(1)  # the answer has begun
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=LONG)
    assert process.returncode == 130 and b"interrupted" in err and b"Traceback" not in err
    eventually(lambda: servers(env, index)[0]["in_flight"] == 0, "the server finished with the request")
    # An answer that ran to its end would have been stored as the session's turn 1.
    assert ask_json(env, index, "What is prefill?", "--session", "gone-1")["turn"] == 1


def test_ctrl_c_during_the_prefill_stops_it_on_the_server(env, index, backend):
    """Ctrl-C while the server still evaluates a long prompt (no piece
    written yet): the server's engine lets the request go at once instead of
    evaluating the whole prompt for nobody (issue 25). State, not time: the
    prompt tokens it evaluated stay short of the question's."""
    ask_json(env, index, "What is prefill?")  # a server runs
    socket = servers(env, index)[0]["socket"]

    def engine() -> dict:
        return call(socket, "GET", "/v1/resident")["engine_stats"]

    def idle() -> bool:
        stats = engine()
        return stats["requests_active"] == stats["requests_waiting"] == stats["passage_warm_queue"] == 0

    eventually(idle, "the server's engine was idle before the question")
    before = engine()["prefill_tokens"]
    question = "Stop me. " + " ".join(f"Is point {n} about prefill?" for n in range(200))
    asked = len(backend.tokenize(question))  # the server runs the same bundled model
    process = subprocess.Popen(RAG + ["ask", question, "--index", str(index), "--max-tokens", "4", "-k", "1"],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        eventually(lambda: engine()["prefill_tokens"] > before, "the server's engine began the prompt")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=LONG)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and b"interrupted" in err and b"Traceback" not in err
    shown = out.decode()
    answer = shown.split("\n\n", 1)[1] if shown.startswith("Evidence [") else shown  # the evidence comes first
    # The answer opens with the quoted evidence, known before the prompt is evaluated: nothing of the model's.
    model = [line for line in answer.splitlines() if line.strip() and not re.match(r"\[\d+\] ", line)]
    assert not model  # no piece of the model's answer had been shown
    eventually(idle, "the server's engine let the request go")
    prefilled = engine()["prefill_tokens"] - before
    assert prefilled < asked, f"{prefilled} prompt tokens evaluated for a question of {asked}"


def test_a_server_that_died_is_replaced(env, index):
    (running,) = servers(env, index)
    os.kill(running["pid"], signal.SIGKILL)
    eventually(lambda: not alive(running["pid"]) or _zombie(running["pid"]), "the server died")
    assert Path(running["socket"]).exists()  # it left its socket behind
    answer = ask_json(env, index, "What is prefill?")
    assert answer["answer"] and answer["cli"]["server_pid"] != running["pid"]
    (now,) = servers(env, index)
    assert now["pid"] == answer["cli"]["server_pid"]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_server_that_cannot_start_says_why_in_one_line(index, run):
    env = shell()
    try:
        missing = Path(env["XDG_RUNTIME_DIR"]) / "missing.gguf"
        by_server = rag(env, "ask", "x", "--index", index, "--model", missing)
        in_process = run("ask", "x", "--index", index, "--model", missing, "--no-server")
        assert_clean_error(in_process, "missing.gguf")
        assert by_server.returncode == 1 and "Traceback" not in by_server.stderr
        assert [l for l in by_server.stderr.splitlines() if l.startswith("error:")] == \
            [l for l in in_process.stderr.splitlines() if l.startswith("error:")]
    finally:
        stop_every_server(env)


def test_the_idle_timeout_stops_the_server(index):
    env = shell(RAG_SERVER_IDLE_S="2")
    try:
        pid = ask_json(env, index, "What is prefill?")["cli"]["server_pid"]
        (socket,) = (Path(env["XDG_RUNTIME_DIR"]) / "rag-budget").glob("*.sock")
        eventually(lambda: not alive(pid) or _zombie(pid), "the idle server stopped")
        assert servers(env, index) == [] and not socket.exists()
    finally:
        stop_every_server(env)


def test_no_server_answers_in_process(index, run, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("RAG_NO_SERVER")
    flag = run("ask", "What is prefill?", "--index", index, "--max-tokens", "4", "--json", "--no-server")
    assert flag.exit_code == 0, flag.output
    assert json.loads(flag.stdout)["cli"] == json.loads(flag.stdout)["cli"] | {"via": "process", "server_pid": None}
    monkeypatch.setenv("RAG_NO_SERVER", "1")
    variable = run("search", "bread", "--index", index, "--json")
    assert variable.exit_code == 0, variable.output
    assert not list((tmp_path / "run").glob("rag-budget/*.sock"))  # no server was started or reached


def test_no_search_or_question_is_lost_to_the_idle_stop(index):
    """Commands that reached the server (as ``rag search`` and ``rag ask``
    do before asking) send their searches and a question at moments around
    a short idle timeout, several at once, some just as the server has
    decided to stop (it says so, or has stopped answering): every one is
    answered, by the server reached or by a fresh one (issues 25 and 27: 5
    of 24 searches failed). In process, through the client the commands
    use, against real server processes."""
    from concurrent.futures import ThreadPoolExecutor

    from rag.errors import RagError
    from rag.qa.options import AskOptions
    from rag.resident.client import ResidentClient
    from rag.resident.lifecycle import probe
    from rag.settings import Settings

    env = shell()
    settings = Settings(index=index, runtime_dir=Path(env["XDG_RUNTIME_DIR"]) / "rag-budget", server_idle_s=1.0)
    address = Address.of(settings)

    def idle_or_stopping(idle_s: float | None) -> bool:
        try:
            info = probe(address)
        except RagError:  # a connection closed by a server going away
            return True
        return info is None or info.get("stopping", False) or (idle_s is not None and info["idle_s"] >= idle_s)

    def search(client: ResidentClient) -> str:
        return client.search("tomatoes need sun", k=1)[0].source

    def ask(client: ResidentClient) -> str:
        stream = client.stream("What limits decode?", AskOptions(max_tokens=4))
        for _piece in stream:
            pass
        return type(stream.answer).__name__

    try:
        assert search(ResidentClient.connect(settings)) == "guide/garden.html"
        pids = set()
        with ThreadPoolExecutor(4) as pool:
            # None: once the server has decided to stop, or is gone.
            for idle_s in (0.8, None, 0.95, None, 1.0, None):
                clients = [ResidentClient.connect(settings) for _ in range(4)]  # each reached the server
                pids.update(c.server_pid for c in clients)
                eventually(lambda: idle_or_stopping(idle_s), "the server idled", within_s=60)
                found = list(pool.map(search, clients[:3])) + [pool.submit(ask, clients[3]).result()]
                assert found == ["guide/garden.html"] * 3 + ["Answer"]
        assert len(pids) > 1  # the stops happened: fresh servers answered
    finally:
        stop_every_server(env)
