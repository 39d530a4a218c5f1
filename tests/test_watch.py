"""A watched folder: changes are ingested again, debounced, each published
as a new generation; stopping is clean, from Python, the command line
(Ctrl-C) and the service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from rag.service import LoopbackServer, ServiceSettings, create_app
from rag.service.settings import WatchedFolder

from .conftest import write_corpus

WAIT_S = 60  # an upper bound on waiting for the watcher, not a timing assertion
AGAIN_S = 3  # a change not yet seen is made again this often (a hang guard's step, not a timing claim)


def _until(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _change_until(change, condition, what: str):
    """Make ``change()`` until ``condition()`` holds, again every
    :data:`AGAIN_S`: a change made before the watcher listens is never seen,
    and how long a watcher takes to start depends on the machine, so no
    sleep guesses it. A change seen twice costs an ingest that finds the
    file unchanged and publishes nothing."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        change()
        again = min(time.monotonic() + AGAIN_S, deadline)
        while time.monotonic() < again:
            value = condition()
            if value:
                return value
            time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def test_changes_are_ingested_and_stopping_is_clean(pipeline_factory, tmp_path):
    docs = write_corpus(tmp_path / "docs")
    pipeline = pipeline_factory(tmp_path / "index")
    pipeline.ingest([docs])
    reports, stop = [], threading.Event()
    watcher = threading.Thread(target=pipeline.library.watch,
                               args=([docs], lambda r, problem, n: reports.append((r, problem, n))),
                               kwargs={"stop": stop})
    watcher.start()
    try:
        def add():
            (docs / "sailing.md").write_text("# Sailing\n\nReef the mainsail before the squall arrives.\n")
            (docs / "images.png").write_bytes(b"\x89PNG")  # not a change that matters

        first = _change_until(add, lambda: [r for r, _, _ in reports if r is not None and r.added], "the new file")[0]
        assert first.added == ["sailing.md"]
        assert pipeline.search("reef the mainsail", k=1)[0].source == "sailing.md"
        (docs / "decode.txt").unlink()
        _until(lambda: any(r is not None and r.removed == ["decode.txt"] for r, _, _ in reports), "the removal")
        assert all(problem is None for _, problem, _ in reports)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert not watcher.is_alive()
    generations = sorted(p.name for p in (tmp_path / "index").glob("gen-*"))
    assert len(generations) <= 2  # each change published whole; older ones cleared away


@pytest.mark.model  # starts rag in processes of its own, which load the models
def test_the_command_line_watches_until_ctrl_c(tmp_path):
    docs = write_corpus(tmp_path / "docs")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
                        "XDG_DATA_HOME": str(tmp_path / "data")}
    code = "import sys; sys.argv[0] = 'rag'; from rag.cli import main; main()"
    proc = subprocess.Popen([sys.executable, "-c", code, "ingest", str(docs), "--index", str(tmp_path / "index"),
                             "--watch"], stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parent.parent)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        _until(lambda: any("watching" in l for l in lines), "the watch to start")  # said before it listens
        _change_until(lambda: (docs / "tides.md").write_text("# Tides\n\nSpring tides follow the full moon.\n"),
                      lambda: any(l.startswith("added 1,") for l in lines), "the change to be ingested")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    text = "".join(lines)
    assert "stopped watching" in text and "Traceback" not in text


def test_the_service_keeps_a_watched_folder_indexed(pipeline_factory, tmp_path):
    docs = write_corpus(tmp_path / "docs")
    pipeline = pipeline_factory(tmp_path / "index")
    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0, watch=[docs])))
    try:
        listed = lambda: {d["source"] for d in httpx.get(f"{server.url}/v1/documents").json().get("documents", [])}
        _until(lambda: "prefill.md" in listed(), "the first ingest")
        anchors = "# Anchors\n\nA kedge anchor is carried out by a small boat.\n"
        _change_until(lambda: (docs / "anchors.md").write_text(anchors), lambda: "anchors.md" in listed(), "the new file")
    finally:
        server.stop()
    assert server.server.should_exit and not server.thread.is_alive()


def test_serve_settings_read_watched_folders(tmp_path, monkeypatch):
    import pytest

    from pydantic import ValidationError

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("RAG_SERVE_WATCH", f"{a},{b}=handbook")
    assert ServiceSettings().watch == [WatchedFolder(a, "default"), WatchedFolder(b, "handbook")]
    assert ServiceSettings(watch=[a]).watch == [WatchedFolder(a)]
    with pytest.raises(ValidationError, match="cannot name a collection"):
        ServiceSettings(watch=[f"{a}=Not A Name"])
    monkeypatch.setenv("RAG_SERVE_WATCH", str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match="no such folder to watch"):
        ServiceSettings()
