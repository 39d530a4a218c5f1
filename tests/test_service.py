"""The HTTP service: a real uvicorn server on 127.0.0.1, the real model."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from rag import Pipeline
from rag.errors import RagError
from rag.service import ServiceSettings, create_app

from .conftest import write_corpus


class Server:
    """uvicorn serving an app on 127.0.0.1 on a free port, in a thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, embedder, backend):
    root = tmp_path_factory.mktemp("service")
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus")])
    return p


@pytest.fixture(scope="module")
def server(pipeline):
    s = Server(create_app(pipeline, ServiceSettings()))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(pipeline):
    s = Server(create_app(pipeline, ServiceSettings(api_keys=["secret-key"])))
    yield s
    s.stop()


def test_healthz_and_ask(server):
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
    r = httpx.post(f"{server.url}/v1/ask", json={"question": "How long should bread dough rise?", "max_tokens": 16},
                   timeout=120)
    assert r.status_code == 200, r.text
    d = r.json()
    assert set(d) >= {"answer", "sources", "budget", "timings"}
    assert d["sources"][0]["source"] == "guide/cooking.rst"
    t = d["timings"]
    assert t["cached_tokens"] + t["prefill_tokens"] == t["prompt_tokens"]


def test_ask_streams_server_sent_events(server):
    events = []
    with httpx.stream("POST", f"{server.url}/v1/ask", timeout=120,
                      json={"question": "What limits decode?", "max_tokens": 12, "stream": True, "session": "http-1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas = [e["delta"] for e in events if "delta" in e]
    assert deltas and "answer" in events[-1]
    assert "".join(deltas).strip() == events[-1]["answer"]["answer"]
    assert events[-1]["answer"]["session"] == "http-1" and events[-1]["answer"]["turn"] == 1


def test_the_openai_client_works_unchanged(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
    reply = client.chat.completions.create(
        model="rag-budget", messages=[{"role": "user", "content": "How long should bread dough rise?"}], max_tokens=16
    )
    assert reply.choices[0].message.content
    assert reply.usage.prompt_tokens > reply.usage.prompt_tokens_details.cached_tokens >= 0
    assert reply.model_dump()["sources"][0]["source"] == "guide/cooking.rst"
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model="rag-budget", messages=[{"role": "user", "content": "What limits decode?"}], max_tokens=12, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces).strip() and usage is not None and usage.completion_tokens > 0


def test_bad_bodies_get_json_errors(server):
    r = httpx.post(f"{server.url}/v1/ask", json={"question": ""})
    assert r.status_code == 422 and "question" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/ask", json={"question": "x", "session": "no spaces"}, timeout=60)
    assert r.status_code == 400 and "session id" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/ask", content=b"{" + b" " * (2 << 20) + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "system", "content": "hi"}]})
    assert r.status_code == 400 and "user message" in r.json()["error"]["message"]
    assert "Traceback" not in r.text


def test_metrics_count_requests(server):
    httpx.post(f"{server.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 8}, timeout=120)
    text = httpx.get(f"{server.url}/metrics").text
    assert "rag_ttft_seconds_count" in text and "rag_queue_depth" in text and "rag_cached_token_ratio" in text


def test_api_keys_are_required_when_set(keyed):
    r = httpx.post(f"{keyed.url}/v1/ask", json={"question": "What is prefill?"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{keyed.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 8},
                   headers={"Authorization": "Bearer secret-key"}, timeout=120)
    assert r.status_code == 200


def test_a_wait_over_the_target_is_answered_429(pipeline):
    app = create_app(pipeline, ServiceSettings())
    s = Server(app)
    try:
        app.state.queue.depth = 50  # fifty requests ahead, a second each
        r = httpx.post(f"{s.url}/v1/ask", json={"question": "What is prefill?", "target_ttft_s": 1.0})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "busy" in r.json()["error"]["message"]
    finally:
        app.state.queue.depth = 0
        s.stop()


def test_exposed_addresses_need_keys():
    with pytest.raises(RagError, match="API keys"):
        ServiceSettings(host="0.0.0.0").check()
    ServiceSettings(host="0.0.0.0", api_keys="a,b").check()
    ServiceSettings(host="::1").check()
