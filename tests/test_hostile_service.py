"""Issue 27, the service, CLI and state side: hostile input against a real
server on 127.0.0.1 with the real model, and crafted state on disk. Each
case is refused in one line or falls back; none freezes the service, gives
a traceback or reads outside the documents given."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from prompt_budget import PromptShape
from rag import Pipeline
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import CORPUS, prepared_pipeline, write_corpus

LONG_NAME = "a" * 240 + ".md"  # near the longest name a file system allows
CATASTROPHIC = "*a" * 14 + "*b"  # a backtracking matcher takes ~n^14 steps over LONG_NAME
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, embedder, backend):
    root = tmp_path_factory.mktemp("hostile27")
    files = dict(CORPUS) | {LONG_NAME: "Aardvarks eat ants at night and sleep in burrows by day.\n"}
    p = prepared_pipeline(root, embedder, backend, files)
    yield p
    p.close()


@pytest.fixture(scope="module")
def server(pipeline):
    s = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(pipeline):
    s = LoopbackServer(create_app(pipeline, ServiceSettings(api_keys=["k1"], rate_limit_per_minute=0)))
    yield s
    s.stop()


# --- 1. scope globs are matched in linear time -----------------------------------------


def test_a_catastrophic_glob_is_matched_at_once_in_a_fresh_process():
    """In its own process, so that a matcher holding the interpreter lock
    fails this test by its timeout (a hang detector, not a timing check)
    instead of freezing the test run."""
    code = ("from rag.retrieval import Scope; import sys; "
            f"s = Scope(sources=[sys.argv[1]]); print(s.allows({LONG_NAME!r}), s.allows('x/' + {LONG_NAME!r}[:-3] + 'b'))")
    try:
        done = subprocess.run([sys.executable, "-c", code, CATASTROPHIC], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"matching {CATASTROPHIC!r} against a {len(LONG_NAME)}-character name did not end in 60 s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("route", ["/v1/search", "/v1/ask"])
def test_a_catastrophic_scope_glob_over_http_is_answered_and_healthz_keeps_answering(server, route):
    body = {"query": "aardvarks", "k": 2} if route == "/v1/search" else \
        {"question": "What do aardvarks eat?", "max_tokens": 2}
    results: dict = {}

    def scoped():
        r = httpx.post(f"{server.url}{route}", json=body | {"scope": {"sources": [CATASTROPHIC]}}, timeout=120)
        results["scoped"] = (r.status_code, r.json())

    worker = threading.Thread(target=scoped)
    worker.start()
    health = [httpx.get(f"{server.url}/healthz", timeout=60).status_code for _ in range(3)]
    worker.join(timeout=120)
    assert health == [200, 200, 200]
    status, answer = results["scoped"]
    # Nothing ends in "b": the scope matches no document, said in one line.
    assert status == 400 and answer["error"]["type"] == "scope_matches_nothing", answer
    r = httpx.post(f"{server.url}{route}", json=body | {"scope": {"sources": ["*a*a*a*a*a*a*.md"]}}, timeout=120)
    assert r.status_code == 200, r.text
    if route == "/v1/search":
        assert {h["source"] for h in r.json()["results"]} == {LONG_NAME}
    else:
        assert {s["source"] for s in r.json()["sources"]} <= {LONG_NAME}


# --- 5. the keyless loopback service checks Host and Origin -----------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "10.0.0.1"])
def test_a_rebound_host_name_is_refused_by_the_keyless_service(server, host):
    for method, path, body in [("GET", "/v1/documents", None), ("POST", "/v1/search", {"query": "prefill"}),
                               ("GET", "/healthz", None)]:
        r = httpx.request(method, f"{server.url}{path}", json=body, headers={"Host": host}, timeout=60)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["type"] == "forbidden" and "\n" not in r.json()["error"]["message"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST.", "[::1]", "127.0.0.2"])
def test_loopback_host_names_are_served(server, host):
    port = server.url.rsplit(":", 1)[1]
    r = httpx.post(f"{server.url}/v1/search", json={"query": "prefill", "k": 1},
                   headers={"Host": f"{host}:{port}"}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_cross_site_form_post_cannot_add_a_document(server, pipeline):
    before = {d["source"] for d in pipeline.documents()}
    files = {"file": ("planted.txt", b"Planted by another web site.", "text/plain")}
    for headers in [{"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}]:
        r = httpx.post(f"{server.url}/v1/documents", files=files, headers=headers, timeout=60)
        assert r.status_code == 403, (headers, r.text)
        # A plain form body too (what <form method=post> sends).
        r = httpx.post(f"{server.url}/v1/search", data={"query": "x"}, headers=headers, timeout=60)
        assert r.status_code == 403, (headers, r.text)
    assert {d["source"] for d in pipeline.documents()} == before


def test_the_page_own_origin_is_served(server):
    r = httpx.post(f"{server.url}/v1/search", json={"query": "prefill", "k": 1},
                   headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_keyed_service_keeps_serving_any_host_with_its_key(keyed):
    r = httpx.post(f"{keyed.url}/v1/search", json={"query": "prefill", "k": 1},
                   headers={"Host": "rag.example.org", "Origin": "https://app.example.org",
                            "Authorization": "Bearer k1"}, timeout=60)
    assert r.status_code == 200, r.text


# --- 8. crafted state falls back or fails in one line ------------------------------------

def test_a_snapshot_file_of_nested_brackets_is_dropped_not_raised(tmp_path):
    import struct

    from engine.llama_cpp.snapshots import MAGIC, SnapshotCache

    header = b"[" * 32_000 + b"]" * 32_000
    bad = tmp_path / "deadbeef.kv"
    bad.write_bytes(MAGIC + struct.pack("<I", len(header)) + header)
    cache = SnapshotCache(disk_dir=tmp_path)  # scans the folder: every answer opens it so
    assert cache.disk_keys() == [] and not bad.exists()  # dropped as damaged: a cache entry is only recomputed


def test_a_manifest_of_nested_brackets_is_a_one_line_error_for_search(run, tmp_path):
    from .conftest import assert_clean_error

    index = tmp_path / "index"
    assert run("ingest", write_corpus(tmp_path / "corpus"), "--index", index).exit_code == 0
    for manifest in index.glob("gen-*/manifest.json"):
        manifest.write_bytes(b"[" * 32_000 + b"]" * 32_000)
    result = run("search", "prefill", "--index", index)
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        assert_clean_error(result)


@pytest.fixture(scope="module")
def measured_profile(tmp_path_factory, backend) -> str:
    """A sound profile of the session's engine, measured once (quick)."""
    from prompt_budget.profile import profile_path
    from rag.qa.costs import CostLearner

    folder = tmp_path_factory.mktemp("profile")
    CostLearner(lambda: backend, folder).model  # noqa: B018 - measured now, and saved
    return profile_path(folder, backend.profile_key()).read_text()


@pytest.mark.parametrize("damage", ["nan ratio", "zero coefficient", "negative coefficient", "nested"])
def test_an_unsound_profile_is_set_aside_and_measured_again(damage, tmp_path, backend, measured_profile):
    import json

    from prompt_budget.profile import load_profile, profile_path
    from rag.qa.costs import CostLearner

    raw = json.loads(measured_profile)
    if damage == "nan ratio":
        raw["ratios"] = [1.0, float("nan")]
    elif damage == "zero coefficient":
        raw["fit"]["coef"] = [0.0 for _ in raw["fit"]["coef"]]
    elif damage == "negative coefficient":
        raw["fit"]["coef"] = [0.01] + [-abs(c) - 1e-4 for c in raw["fit"]["coef"][1:]]
    path = profile_path(tmp_path, backend.profile_key())
    path.write_text(json.dumps(raw) if damage != "nested" else "[" * 50_000 + "]" * 50_000)
    assert load_profile(tmp_path, backend.profile_key()) is None  # refused, said in the log
    assert path.with_name(path.name + ".damaged").exists()
    path.write_text(json.dumps(raw) if damage != "nested" else "[" * 50_000 + "]" * 50_000)
    notes: list[str] = []
    fresh = CostLearner(lambda: backend, tmp_path, notice=notes.append).model  # measured again: sound
    assert notes and "calibration" in notes[0]
    assert fresh.fit.coef[1] > 0 and fresh.predict(PromptShape(1000)) > 0


def test_lock_and_current_as_folders_and_an_uncreatable_data_folder_are_one_line_errors(run, tmp_path, monkeypatch):
    from .conftest import assert_clean_error

    corpus = write_corpus(tmp_path / "corpus")
    emptied = tmp_path / "emptied"
    emptied.mkdir()
    (emptied / ".lock").mkdir()
    assert run("ingest", corpus, "--index", emptied).exit_code == 0  # an empty folder where the lock goes is replaced
    locked = tmp_path / "locked"
    (locked / ".lock").mkdir(parents=True)
    (locked / ".lock" / "kept.txt").write_text("someone's file")
    assert_clean_error(run("ingest", corpus, "--index", locked), ".lock")
    assert (locked / ".lock" / "kept.txt").exists()  # a folder with something in it is never removed
    current = tmp_path / "current"
    assert run("ingest", corpus, "--index", current).exit_code == 0
    (current / "CURRENT").unlink()
    (current / "CURRENT").mkdir()
    searched = run("search", "prefill", "--index", current)  # the newest generation is still found
    assert "Traceback" not in searched.output and searched.exit_code in (0, 1), searched.output
    (corpus / "new.md").write_text("A new note about sourdough starters.\n")
    assert_clean_error(run("ingest", corpus, "--index", current), "CURRENT")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    assert_clean_error(run("ingest", corpus, "--index", blocked / "index"), str(blocked))
    monkeypatch.setenv("RAG_DATA_DIR", str(blocked / "data"))
    monkeypatch.setenv("XDG_DATA_HOME", str(blocked / "xdg"))
    result = run("ask", "What is prefill?", "--max-tokens", "2", "--session", "s1")
    assert "Traceback" not in result.output, result.output
    if result.exit_code:
        assert_clean_error(result)


def test_a_truncated_chunk_database_under_a_running_server_is_a_one_line_503(tmp_path, embedder, backend):
    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite")
    p.ingest([write_corpus(tmp_path / "corpus")])
    p.prepare()
    s = LoopbackServer(create_app(p, ServiceSettings(rate_limit_per_minute=0)))
    try:
        assert httpx.post(f"{s.url}/v1/search", json={"query": "prefill"}, timeout=60).status_code == 200
        for db in (tmp_path / "index").glob("gen-*/chunks.sqlite"):
            with open(db, "r+b") as fh:
                fh.truncate(1024)
        for body, route in [({"query": "bread"}, "/v1/search"), ({"question": "bread?", "max_tokens": 2}, "/v1/ask")]:
            r = httpx.post(f"{s.url}{route}", json=body, timeout=120)
            assert r.status_code in (200, 503), (route, r.text)
            if r.status_code == 503:
                err = r.json()["error"]
                assert err["type"] == "index_damaged" and "\n" not in err["message"], err
                assert "internal error" not in err["message"]
    finally:
        s.stop()
        p.close()


# --- 9. Rich markup in document text and option values ----------------------------------


def test_markup_in_document_text_and_option_values_does_not_crash_the_cli(run, tmp_path):
    from .conftest import assert_clean_error

    index = tmp_path / "index"
    corpus = write_corpus(tmp_path / "corpus", {"odd [/i]/notes [b].md": "A stray [/i] closing tag and [bold]x[/] in text about llamas.\n"})
    assert run("ingest", corpus, "--index", index).exit_code == 0
    result = run("search", "stray closing tag llamas", "--index", index)
    assert result.exit_code == 0, result.output
    assert "stray [/i] closing tag" in result.stdout
    assert_clean_error(run("search", "llamas", "--source", "stray [/i]", "--index", index), "stray [/i]")
    explained = run("ask", "llamas?", "--index", index, "--max-tokens", "2", "--explain", "--target-ttft", "none")
    assert explained.exit_code == 0, explained.output
    assert "odd [/i]" in explained.stdout


# --- 10. admission, metrics, Ctrl-C ------------------------------------------------------


def test_an_idle_engine_never_answers_busy_at_the_default_target(server):
    """A long question misses the default target on an idle engine too:
    it is answered late, not refused as if the engine were busy."""
    question = "Tell me about prefill. " + " ".join(f"word{i}" for i in range(500)) + " What is prefill?"
    r = httpx.post(f"{server.url}/v1/ask", json={"question": question, "max_tokens": 2}, timeout=300)
    assert r.status_code == 200, r.text


def test_a_question_that_can_never_fit_is_413_not_429(server):
    question = " ".join(f"w{i}" for i in range(3000))  # past the 2048-token context on its own, under 20k characters
    for body in [{"question": question, "max_tokens": 2}, {"question": question, "max_tokens": 2, "stream": True}]:
        r = httpx.post(f"{server.url}/v1/ask", json=body, timeout=300)
        assert r.status_code == 413, r.text
        assert "Retry-After" not in r.headers and "too long" in r.json()["error"]["message"]


def test_metrics_do_not_grow_with_unknown_paths(pipeline):
    s = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=1)))
    try:
        for i in range(40):
            httpx.get(f"{s.url}/no/such/path/{i}", timeout=60)
            httpx.delete(f"{s.url}/v1/documents/doc{i}", timeout=60)
        text = httpx.get(f"{s.url}/metrics", timeout=60).text
        assert "/no/such/path" not in text and "doc1" not in text
        lines = [line for line in text.splitlines() if line.startswith("rag_requests_total{")]
        assert 0 < len(lines) <= 4, lines
    finally:
        s.stop()


def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path):
    import os
    import signal

    code = ("import sys; sys.argv = ['rag', 'ask', 'What is prefill?', '--max-tokens', '2']; "
            "sys.stderr.write('ready\\n'); sys.stderr.flush(); from rag.cli import main; main()")
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAG_NO_SERVER="1", RAG_INDEX=str(tmp_path / "index"))
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            cwd=ROOT)
    assert proc.stderr.readline() == b"ready\n"
    time.sleep(0.05)  # into the command's imports (not a timing claim: where the Ctrl-C lands)
    proc.send_signal(signal.SIGINT)  # while the command's modules are imported
    out, err = proc.communicate(timeout=120)
    text = err.decode(errors="replace")
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert proc.returncode in (1, 130), (proc.returncode, text)
    assert len([line for line in text.splitlines() if line.strip()]) == 1, text


def test_a_collection_named_in_the_query_is_checked_as_a_body_names_it(server):
    # Found by the generated requests: "?collection=/" reached the uploads folder's name (a 500).
    for method, path, extra in (("POST", "/v1/documents", {"files": {"file": ("a.md", b"# A\n\nText.\n")}}),
                                ("GET", "/v1/documents", {}), ("GET", "/v1/sessions", {})):
        r = httpx.request(method, f"{server.url}{path}", params={"collection": "a/../b"}, timeout=60, **extra)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
        assert "cannot name a collection" in r.json()["error"]["message"]
