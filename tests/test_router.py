"""Several engines through vLLM's router: the real ``vllm-router`` (from the
package index, unchanged) over real llama-server workers on 127.0.0.1.

Answers and the budget's learning through it, ``--engine-url a,b`` starting
it (or refused with how to start it), a worker killed in the middle of an
answer (a clear error, never a hang, and the next questions answered), and
a worker added while it runs."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from engine.errors import EngineUnreachable
from engine.models import default_model_path
from engine.remote import router as router_module
from engine.remote.backend import RemoteBackend
from engine.remote.llama_server import LlamaServer
from engine.remote.router import RouterProcess, router_binary
from engine.opening import open_backend
from engine.settings import EngineSettings
from rag import EngineUnavailable, Pipeline

pytestmark = pytest.mark.model

if router_binary() is None:  # the test extra installs it: without it these tests cannot say anything
    pytest.fail("vllm-router is not installed (pip install 'rag-budget[router]')", pytrace=False)


def _worker(tmp_path_factory, name: str) -> LlamaServer:
    # --metrics: a worker's own count of the prompt tokens it evaluated says whether the router used it.
    return LlamaServer(default_model_path(), n_ctx=4096, slots=2, threads=1, extra=("--metrics",),
                       log=tmp_path_factory.mktemp(f"worker-{name}") / "log")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    started = [_worker(tmp_path_factory, name) for name in "ab"]
    yield started
    for worker in started:
        worker.stop()


def _settings(urls: str, policy: str = "cache_aware") -> EngineSettings:
    return EngineSettings(engine_url=urls, engine_routing=policy)


def _open(urls: str, policy: str = "cache_aware") -> RemoteBackend:
    backend = open_backend(_settings(urls, policy), model=None, snapshot_dir=None)
    assert isinstance(backend, RemoteBackend)
    return backend


def prompt_tokens_seen(worker: LlamaServer) -> float:
    """The prompt tokens ``worker`` evaluated so far, by its own /metrics."""
    for line in httpx.get(f"{worker.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError("llama-server's /metrics has no llamacpp:prompt_tokens_total")


def decoding(worker: LlamaServer) -> bool:
    """Whether one of ``worker``'s slots is processing a request now."""
    return any(slot.get("is_processing") for slot in httpx.get(f"{worker.url}/slots", timeout=10).json())


def test_several_engine_urls_start_the_router_and_the_budget_learns_through_it(workers, embedder, corpus, tmp_path):
    urls = ",".join(w.url for w in workers)
    backend = _open(urls)
    router = backend._owned
    assert isinstance(router, RouterProcess) and router.process.poll() is None
    assert sorted(backend.workers) == sorted(w.url for w in workers)
    assert backend.describe()["router"] == "vllm-router"
    assert backend.parallel == 2 * 2  # two slots on each of two workers
    # Keyed by the workers, not the router's own port: another process's router finds the same profile.
    assert backend.profile_key()["url"] == ",".join(sorted(w.url for w in workers))
    pipeline = Pipeline(tmp_path / "index", embedder=embedder, backend=backend, profile_dir=tmp_path / "profiles",
                        conversations=tmp_path / "c.sqlite")
    pipeline.ingest([corpus])
    pipeline.calibrate(quick=True)
    first = pipeline.ask("What limits decode speed?", target_ttft=5.0, max_tokens=8, session="s")
    before = len(pipeline.cost_model.samples)
    second = pipeline.ask("And what limits prefill?", target_ttft=5.0, max_tokens=8, session="s")
    # Learnt from the response's own figures, the worker's timings relayed by the router.
    assert len(pipeline.cost_model.samples) == before + 1
    assert first.timings.prompt_tokens > 0 and second.timings.prefill_s > 0
    # cache_aware sent the follow-up to the worker holding the conversation's start.
    assert second.timings.cached_tokens > 0
    assert second.timings.cached_tokens + second.timings.prefill_tokens == second.timings.prompt_tokens
    pipeline.close()
    backend.close()
    assert router.process.poll() is not None  # the router started for this backend stopped with it


def test_without_the_router_installed_several_urls_are_refused_with_how_to_start_it(workers, monkeypatch, tmp_path):
    monkeypatch.setattr(router_module, "router_binary", lambda: None)
    urls = ",".join(w.url for w in workers)
    with pytest.raises(EngineUnreachable) as refused:
        _open(urls)
    message = str(refused.value)
    assert "pip install 'rag-budget[router]'" in message and "vllm-router" in message
    assert f"--worker-urls {workers[0].url} {workers[1].url}" in message and "--engine-url" in message
    from rag.settings import Settings

    pipeline = Pipeline(tmp_path / "index", settings=Settings.load(engine_url=urls))
    with pytest.raises(EngineUnavailable, match="vllm-router"):
        pipeline.backend
    pipeline.close()


def test_a_worker_killed_mid_answer_is_a_clear_error_and_the_next_questions_are_answered(tmp_path_factory):
    doomed, other = _worker(tmp_path_factory, "doomed"), _worker(tmp_path_factory, "other")
    try:
        with RouterProcess([doomed.url, other.url]) as router:
            backend = RemoteBackend(router.url)
            generation = backend.generate(backend.tokenize("Once upon a time, a llama"), max_tokens=400)
            outcome: dict[str, object] = {}

            def read() -> None:
                try:
                    outcome["text"] = generation.result()[0]
                except EngineUnreachable as exc:
                    outcome["error"] = str(exc)

            reader = threading.Thread(target=read)
            reader.start()
            # Kill whichever worker is decoding it.
            deadline = time.monotonic() + 60
            serving = None
            while serving is None and time.monotonic() < deadline:
                serving = next((w for w in (doomed, other) if decoding(w)), None)
                time.sleep(0.05)
            assert serving is not None, "neither worker began the answer"
            survivor = other if serving is doomed else doomed
            serving.kill()
            reader.join(timeout=60)
            assert not reader.is_alive(), "the stream hung after its worker was killed"
            # Either a clear error naming the engine, or the answer the router retried elsewhere.
            assert "error" in outcome or outcome.get("text")
            if "error" in outcome:
                assert router.url in outcome["error"] and "broke off" in outcome["error"]
            # Questions after the kill: none lost, all answered by the worker left.
            answered = [backend.generate(backend.tokenize(f"Question {n}: what is a llama?"), max_tokens=4).result()
                        for n in range(4)]
            assert all(timings.decode_tokens > 0 for _, timings in answered)
            assert prompt_tokens_seen(survivor) > 0
            backend.close()
    finally:
        doomed.stop()
        other.stop()


def test_a_worker_added_to_the_router_takes_requests(workers, tmp_path_factory):
    added = _worker(tmp_path_factory, "added")
    try:
        with RouterProcess([w.url for w in workers], policy="round_robin") as router:
            backend = RemoteBackend(router.url)
            router.add_worker(added.url)
            assert added.url in router.workers()
            for n in range(6):  # round robin over three workers: the new one gets two of them
                backend.generate(backend.tokenize(f"Question {n}: where do llamas live?"), max_tokens=2).result()
            assert prompt_tokens_seen(added) > 0
            backend.close()
    finally:
        added.stop()


def test_over_http_a_worker_killed_mid_answer_ends_the_stream_with_an_error_and_nothing_else_is_lost(
        tmp_path_factory, embedder, corpus, tmp_path):
    import json

    from rag.service import LoopbackServer, ServiceSettings, create_app

    doomed, other = _worker(tmp_path_factory, "http-doomed"), _worker(tmp_path_factory, "http-other")
    server = None
    try:
        backend = _open(f"{doomed.url},{other.url}")
        pipeline = Pipeline(tmp_path / "index", embedder=embedder, backend=backend,
                            profile_dir=tmp_path / "profiles", conversations=tmp_path / "c.sqlite")
        pipeline.ingest([corpus])
        server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
        health = httpx.get(f"{server.url}/healthz", timeout=30).json()
        assert sorted(health["engines"]["workers"]) == sorted([doomed.url, other.url])
        events: list[dict] = []
        killed = None
        body = {"question": "What limits decode speed?", "max_tokens": 300, "target_ttft_s": 60, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/ask", json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                if killed is None and "delta" in events[-1]:
                    killed = next((w for w in (doomed, other) if decoding(w)), None)
                    if killed is not None:
                        killed.kill()
        # The stream ended (no hang): with the answer, or with one error event naming the engine.
        assert killed is not None, "the answer was over before a worker could be killed"
        last = events[-1]
        assert "answer" in last or last["error"]["type"] == "engine_unavailable", last
        # Questions after it: every one answered, by the worker left.
        for question in ("What is prefill?", "How long does bread bake?", "What is decode?"):
            r = httpx.post(f"{server.url}/v1/ask", timeout=120,
                           json={"question": question, "max_tokens": 4, "target_ttft_s": 60})
            assert r.status_code == 200, r.text
            assert r.json()["answer"] is not None
        pipeline.close()
        backend.close()
    finally:
        if server is not None:
            server.stop()
        doomed.stop()
        other.stop()


HOLD_A_ROUTER = """
import sys, time
from engine.remote.router import RouterProcess
router = RouterProcess(sys.argv[1:])
print(router.process.pid, flush=True)
if router.process.poll() is None:
    time.sleep(600)
"""


@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
def test_a_router_started_for_a_process_ends_with_it_even_one_killed(workers, end):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = HOLD_A_ROUTER if end == "SIGKILL" else HOLD_A_ROUTER.replace("time.sleep(600)", "pass")
    holder = subprocess.Popen([sys.executable, "-c", script, *(w.url for w in workers)], stdout=subprocess.PIPE,
                              text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    router_pid = int(holder.stdout.readline())
    if end == "SIGKILL":
        holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and Path(f"/proc/{router_pid}").exists() and \
            Path(f"/proc/{router_pid}/stat").read_text().split()[2] != "Z":
        time.sleep(0.1)
    alive = Path(f"/proc/{router_pid}").exists() and Path(f"/proc/{router_pid}/stat").read_text().split()[2] != "Z"
    assert not alive, f"the router (pid {router_pid}) outlived the process that started it ({end})"
