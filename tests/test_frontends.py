"""Several front-ends over one index folder and one conversation store:
only one writes the index at a time (a lock across processes), the others
answer from each new generation once it is published, and two real
``rag serve`` processes, each through vLLM's router over the same real
llama-server engines, and a real
PostgreSQL serve one conversation alternately without losing or duplicating
a turn."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag import Pipeline
from rag.errors import IndexBusy
from tests.conftest import write_corpus

ROOT = Path(__file__).resolve().parent.parent

HOLD_INDEX = """
import sys
from rag.index.generations import write_lock
with write_lock(sys.argv[1]):
    print("writing", flush=True)
    sys.stdin.readline()
"""


def holding_the_index(index: Path) -> subprocess.Popen:
    """Another process that holds the index's write lock until told to stop."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_INDEX, str(index)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "writing"
    return holder


def release(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(timeout=30)


def test_one_writer_at_a_time_and_readers_pick_up_each_new_generation(embedder, corpus, tmp_path):
    index = tmp_path / "index"
    writer = Pipeline(index, embedder=embedder, conversations=tmp_path / "a.sqlite")
    reader = Pipeline(index, embedder=embedder, conversations=tmp_path / "b.sqlite")
    writer.ingest([corpus])
    assert "llamas.md" not in {h.source for h in reader.search("woolly llamas", k=5)}
    extra = write_corpus(tmp_path / "more", {"llamas.md": "Woolly llamas graze in the high Andes.\n"})
    writer.ingest([extra])
    # The reader was told nothing: it reads CURRENT and opens the new generation.
    assert reader.search("woolly llamas", k=1)[0].source == "llamas.md"
    holder = holding_the_index(index)
    try:
        with pytest.raises(IndexBusy, match="another process is writing"):
            reader.ingest([extra])
    finally:
        release(holder)
    assert reader.ingest([extra]).skipped == ["llamas.md"]
    writer.close()
    reader.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FrontEnd:
    """A real ``rag serve`` process on 127.0.0.1."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log, self.log_path = open(log, "wb"), log
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from rag.cli import main; main()", "serve", "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        from engine.remote.process import wait_until_ready

        wait_until_ready(self.process, f"{self.url}/healthz", timeout_s, "rag serve", self.log_path)

    def ask(self, question: str, session: str) -> dict:
        r = httpx.post(f"{self.url}/v1/ask", json={"question": question, "session": session, "max_tokens": 12,
                                                    "target_ttft_s": 60}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def index_and_profile_through_a_router(urls: str, index, embedder, cache: Path, tmp_path: Path) -> None:
    """The sample corpus indexed into ``index`` and a quick profile measured
    under ``cache`` through vLLM's router over ``urls``. Each front-end then
    starts a router of its own over them (``RAG_ENGINE_URL`` holds both); the
    profile is keyed by the workers, so they find it."""
    from engine.remote.backend import RemoteBackend
    from engine.remote.router import RouterProcess

    router = RouterProcess(urls.split(","))
    remote = RemoteBackend(router.url, owned=router)
    setup = Pipeline(index, embedder=embedder, backend=remote, profile_dir=cache / "profiles",
                     conversations=tmp_path / "setup.sqlite")
    setup.ingest([write_corpus(tmp_path / "corpus")])
    setup.calibrate(quick=True)
    setup.close()
    remote.close()


@pytest.mark.model
def test_two_front_ends_share_one_conversation_without_losing_or_duplicating_a_turn(
        tmp_path_factory, embedder, postgres_url, tmp_path):
    from engine.models import default_model_path
    from rag.conversations import open_store
    from engine.remote.llama_server import LlamaServer

    engines = [LlamaServer(default_model_path(), n_ctx=4096, slots=2, log=tmp_path_factory.mktemp(f"fe-{n}") / "log")
               for n in "ab"]
    urls = ",".join(e.url for e in engines)
    index, cache = tmp_path / "index", tmp_path / "cache"
    # The index and each engine's profile, made once here; the front-ends find both.
    index_and_profile_through_a_router(urls, index, embedder, cache, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")} | {
        "PYTHONPATH": str(ROOT), "RAG_INDEX": str(index), "RAG_CACHE_DIR": str(cache), "RAG_ENGINE_URL": urls,
        "RAG_CONVERSATIONS": postgres_url, "RAG_SERVE_RATE_LIMIT_PER_MINUTE": "0"}
    fronts = [FrontEnd(env, tmp_path / f"serve-{n}.log") for n in "ab"]
    try:
        for front in fronts:
            front.wait_ready()
        questions = ["What is prefill?", "What does it fill?", "Who feels it?", "What is decode?"]
        answers = [fronts[i % 2].ask(q, "shared") for i, q in enumerate(questions)]
        # Alternately: each front-end saw every turn the other stored before it.
        assert [a["turn"] for a in answers] == [1, 2, 3, 4]
        assert [a["turns_shown"] for a in answers] == [0, 1, 2, 3]
        with ThreadPoolExecutor(2) as pool_of_clients:  # and both at once: one waits for the other
            both = list(pool_of_clients.map(lambda f: f.ask("Why is decode slow?", "shared"), fronts))
        assert sorted(a["turn"] for a in both) == [5, 6]
        assert sorted(a["turns_shown"] for a in both) == [4, 5]
        store = open_store(postgres_url)
        stored = store.load("shared")
        assert [t.number for t in stored.turns] == [1, 2, 3, 4, 5, 6]
        assert [t.question for t in stored.turns][:4] == questions
        store.close()
        # One front-end ingests; the other answers from the new generation.
        upload = httpx.post(f"{fronts[0].url}/v1/documents", timeout=120,
                            files={"file": ("llamas.md", b"Woolly llamas graze in the high Andes.\n")})
        assert upload.status_code == 200, upload.text
        r = httpx.post(f"{fronts[1].url}/v1/ask", timeout=300, json={
            "question": "Where do llamas graze?", "max_tokens": 8, "target_ttft_s": 60,
            "scope": {"sources": ["llamas.md"]}})
        assert r.status_code == 200 and [s["source"] for s in r.json()["sources"]] == ["llamas.md"]
        holder = holding_the_index(index)
        try:
            busy = httpx.post(f"{fronts[1].url}/v1/documents", timeout=120,
                              files={"file": ("alpacas.md", b"Alpacas are smaller than llamas.\n")})
            assert busy.status_code == 409 and busy.headers["retry-after"]
        finally:
            release(holder)
    finally:
        for front in fronts:
            front.stop()
        for engine in engines:
            engine.stop()


def _upload_until_taken(url: str, name: str, data: bytes) -> httpx.Response:
    """Upload ``name`` as the page does: a 409 (another front-end is writing) is tried again after Retry-After."""
    for _ in range(30):
        r = httpx.post(f"{url}/v1/documents", files={"file": (name, data)}, timeout=300)
        if r.status_code != 409:
            return r
        time.sleep(float(r.headers.get("retry-after", "1")))
    return r


@pytest.mark.model
def test_two_front_ends_ingest_into_one_postgres_index_while_both_answer_through_the_router(
        tmp_path_factory, embedder, pgvector_url, tmp_path):
    import psycopg

    from engine.models import default_model_path
    from engine.remote.llama_server import LlamaServer

    engines = [LlamaServer(default_model_path(), n_ctx=4096, slots=2, threads=1,
                           log=tmp_path_factory.mktemp(f"pg-fe-{n}") / "log") for n in "ab"]
    urls = ",".join(e.url for e in engines)
    cache = tmp_path / "cache"
    index_and_profile_through_a_router(urls, pgvector_url, embedder, cache, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")} | {
        "PYTHONPATH": str(ROOT), "RAG_INDEX": pgvector_url, "RAG_CACHE_DIR": str(cache), "RAG_ENGINE_URL": urls,
        "RAG_SERVE_RATE_LIMIT_PER_MINUTE": "0"}
    fronts = [FrontEnd(env | {"RAG_DATA_DIR": str(tmp_path / f"data-{n}")}, tmp_path / f"serve-{n}.log") for n in "ab"]
    animals = ["llamas", "alpacas", "vicunas", "guanacos", "camels", "yaks"]
    uploads = {f"{animal}-{n}.md": f"Woolly {animal} of front-end {n} graze in the high Andes at dawn.\n".encode()
               for n in (0, 1) for animal in animals}
    try:
        for front in fronts:
            front.wait_ready()

        def upload(n: int) -> list[int]:
            return [_upload_until_taken(fronts[n].url, name, data).status_code
                    for name, data in uploads.items() if name.endswith(f"-{n}.md")]

        def ask(n: int) -> list[str]:
            return [fronts[n].ask(q, f"s{n}")["answer"] for q in ("What is prefill?", "What is decode?", "Why?")]

        with ThreadPoolExecutor(4) as pool:  # both ingest while both answer
            uploaded = [pool.submit(upload, n) for n in (0, 1)]
            answered = [pool.submit(ask, n) for n in (0, 1)]
            statuses = [code for f in uploaded for code in f.result()]
            answers = [a for f in answered for a in f.result()]
        assert statuses == [200] * len(uploads)
        assert len(answers) == 6 and all(a is not None for a in answers)
        # Both front-ends list every document, the other's uploads included.
        listed = [{d["source"] for d in httpx.get(f"{f.url}/v1/documents", timeout=60).json()["documents"]}
                  for f in fronts]
        assert listed[0] == listed[1] and set(uploads) <= listed[0]
        # In the database: each upload once, its chunks once each, and the counts agree.
        with psycopg.connect(pgvector_url) as db:
            files = db.execute("SELECT source, count(*) FROM rag_index.files GROUP BY source").fetchall()
            assert all(count == 1 for _, count in files) and set(uploads) <= {s for s, _ in files}
            doubled = db.execute("SELECT file_id, position FROM rag_index.chunks GROUP BY file_id, position "
                                 "HAVING count(*) > 1").fetchall()
            assert doubled == []
            expected, stored = db.execute("SELECT (SELECT sum(n_chunks) FROM rag_index.files), "
                                          "(SELECT count(*) FROM rag_index.chunks)").fetchone()
            assert expected == stored
        # And each answers from the other's upload.
        r = httpx.post(f"{fronts[1].url}/v1/ask", timeout=300, json={
            "question": "Where do the yaks of front-end 0 graze?", "max_tokens": 8, "target_ttft_s": 60,
            "scope": {"sources": ["yaks-0.md"]}})
        assert r.status_code == 200 and [s["source"] for s in r.json()["sources"]] == ["yaks-0.md"]
    finally:
        for front in fronts:
            front.stop()
        for engine in engines:
            engine.stop()
