"""The HTTP service: a real uvicorn server on 127.0.0.1, the real model."""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time

import httpx
import pytest

from rag import Pipeline
from rag.errors import RagError
from rag.service import LoopbackServer as Server
from rag.service import ServiceSettings, create_app

from .answer_contract import missing_fields
from .conftest import write_corpus


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, embedder, backend):
    root = tmp_path_factory.mktemp("service")
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus")])
    return p


@pytest.fixture(scope="module")
def server(pipeline):
    s = Server(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))  # the limit has its own test
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
    assert missing_fields(d) == []  # the whole answer contract, which /v1/ask declares as its response model
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
    assert missing_fields(reply.model_dump()["rag"]) == []  # the extension: the whole answer contract
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
    r = httpx.get(f"{server.url}/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


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


def _busy_engine(monkeypatch, pipeline, wait_s: float = 50.0) -> None:
    # The engine reports fifty seconds of queue ahead of a new request: its one report, at the seam.
    from engine.scheduler import Ahead

    monkeypatch.setattr(pipeline.backend, "ahead", lambda deadline, cost: Ahead(wait_s=wait_s), raising=False)


def test_a_wait_over_the_target_is_answered_429(pipeline, monkeypatch):
    _busy_engine(monkeypatch, pipeline)
    s = Server(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    try:
        r = httpx.post(f"{s.url}/v1/ask", json={"question": "What is prefill?", "target_ttft_s": 1.0}, timeout=120)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 49  # the wait the engine reported
        assert "busy" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_over_the_target_can_be_served_with_the_least_context(pipeline, monkeypatch):
    _busy_engine(monkeypatch, pipeline)
    s = Server(create_app(pipeline, ServiceSettings(reject_over_target=False, rate_limit_per_minute=0)))
    try:
        r = httpx.post(f"{s.url}/v1/ask", json={"question": "What is prefill?", "target_ttft_s": 1.0, "max_tokens": 4},
                       timeout=120)
        assert r.status_code == 200 and r.json()["budget"]["chosen"] == 1 and len(r.json()["sources"]) == 1
    finally:
        s.stop()


def test_exposed_addresses_need_keys():
    with pytest.raises(RagError, match="API keys"):
        ServiceSettings(host="0.0.0.0").check()
    ServiceSettings(host="0.0.0.0", api_keys="a,b").check()
    ServiceSettings(host="::1").check()


def test_upload_list_ask_delete_a_document(server, pipeline):
    text = b"Llamas\n======\n\nLlamas hum softly when they are content, and they spit when annoyed.\n"
    r = httpx.post(f"{server.url}/v1/documents", files={"file": ("../../llama notes.md", text)}, timeout=120)
    assert r.status_code == 200, r.text
    (doc,) = r.json()["documents"]
    assert doc["source"] == "llama notes.md" and doc["chunks"] >= 1
    assert (pipeline.library.uploads_dir / "llama notes.md").is_file()
    assert not (pipeline.index_location.parent.parent / "llama notes.md").exists()  # no path traversal
    listed = httpx.get(f"{server.url}/v1/documents").json()["documents"]
    assert doc["id"] in {d["id"] for d in listed}
    answer = httpx.post(f"{server.url}/v1/ask", json={"question": "When do llamas hum?", "max_tokens": 8}, timeout=120).json()
    best = max(answer["sources"], key=lambda src: src["score"])  # sources are in prompt (citation) order
    assert best["source"] == "llama notes.md"
    r = httpx.delete(f"{server.url}/v1/documents/{doc['id']}", timeout=120)
    assert r.status_code == 200 and r.json()["deleted"]["source"] == "llama notes.md"
    assert doc["id"] not in {d["id"] for d in httpx.get(f"{server.url}/v1/documents").json()["documents"]}
    assert not (pipeline.library.uploads_dir / "llama notes.md").exists()
    assert httpx.delete(f"{server.url}/v1/documents/{doc['id']}").status_code == 404


def test_unreadable_uploads_are_refused_and_change_nothing(server, pipeline):
    before = httpx.get(f"{server.url}/v1/documents").json()["documents"]
    r = httpx.post(f"{server.url}/v1/documents", files={"file": ("blob.txt", bytes(range(256)) * 8)}, timeout=120)
    assert r.status_code == 422 and "blob.txt" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/documents", files={"file": ("...", b"text")}, timeout=60)
    assert r.status_code == 400 and "file name" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/documents").json()["documents"] == before
    assert not (pipeline.library.uploads_dir / "blob.txt").exists()


def test_upload_size_and_rate_limits(pipeline):
    s = Server(create_app(pipeline, ServiceSettings(max_upload_bytes=2048, rate_limit_per_minute=6)))
    try:
        r = httpx.post(f"{s.url}/v1/documents", files={"file": ("big.md", b"word " * 2000)})
        assert r.status_code == 413
        codes = [httpx.get(f"{s.url}/v1/documents").status_code for _ in range(8)]
        assert 429 in codes and codes[0] == 200
        r = httpx.get(f"{s.url}/v1/documents")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "rate limit" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "rate_limited"
    finally:
        s.stop()


def test_queries_during_an_ingest_see_a_whole_index(server):
    body = ("Alpacas\n=======\n\n" + "Alpacas are kept for their fleece, which is soft and warm. " * 400).encode()
    results = {}

    def upload():
        results["upload"] = httpx.post(f"{server.url}/v1/documents", files={"file": ("alpacas.md", body)}, timeout=300)

    thread = threading.Thread(target=upload)
    thread.start()
    asks = []
    while thread.is_alive() or not asks:
        asks.append(httpx.post(f"{server.url}/v1/ask",
                               json={"question": "How long should bread dough rise?", "max_tokens": 4}, timeout=120))
    thread.join()
    assert results["upload"].status_code == 200, results["upload"].text
    assert all(a.status_code == 200 for a in asks), [a.text for a in asks if a.status_code != 200]
    assert all(a.json()["sources"] for a in asks)


def test_a_restart_keeps_documents_and_sessions(tmp_path, embedder, backend):
    def start():
        p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite")
        return p, Server(create_app(p, ServiceSettings()))

    p, s = start()
    try:
        r = httpx.post(f"{s.url}/v1/documents", files={"file": ("kv.md", b"The KV cache holds keys and values of past tokens.\n")}, timeout=120)
        assert r.status_code == 200, r.text
        first = httpx.post(f"{s.url}/v1/ask", json={"question": "What does the KV cache hold?", "session": "keep", "max_tokens": 8}, timeout=120)
        assert first.json()["turn"] == 1
    finally:
        s.stop()
        p.close()
    p, s = start()
    try:
        assert [d["source"] for d in httpx.get(f"{s.url}/v1/documents").json()["documents"]] == ["kv.md"]
        again = httpx.post(f"{s.url}/v1/ask", json={"question": "And of which tokens?", "session": "keep", "max_tokens": 8}, timeout=120)
        assert again.json()["turn"] == 2 and again.json()["turns_shown"] == 1
    finally:
        s.stop()
        p.close()


def test_a_client_that_disconnects_cancels_its_generation(pipeline):
    app = create_app(pipeline, ServiceSettings(rate_limit_per_minute=0))
    s = Server(app)
    try:
        with httpx.stream("POST", f"{s.url}/v1/ask", timeout=120, json={
            "question": "Explain prefill and decode in detail.", "max_tokens": 400, "stream": True, "session": "gone",
        }) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and "delta" in line:
                    break  # one piece, then hang up
        deadline = time.monotonic() + 60
        while app.state.service.answering.depth and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.service.answering.depth == 0
        # A finished answer would have been stored as the session's turn 1.
        assert pipeline.conversation("gone").turns == ()
        ok = httpx.post(f"{s.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 4}, timeout=120)
        assert ok.status_code == 200
    finally:
        s.stop()


def _engine_idle(app, loop) -> bool:
    published = loop.published
    return not (app.state.service.answering.depth or published.active or published.waiting or published.warming)


def _wait(check, what: str, within_s: float = 300) -> None:
    deadline = time.monotonic() + within_s  # a hang guard, not a timing check
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _model_text(raw: bytes) -> str:
    """The text of a stream's pieces in ``raw`` (its events so far) that is
    not the answer's quoted evidence ("[1] about: \"...\"" lines)."""
    pieces = []
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data: "):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue  # cut at the end of what was read so far
        choice = (event.get("choices") or [{}])[0] if isinstance(event, dict) else {}
        pieces.append(event.get("delta") or (choice.get("delta") or {}).get("content") or "")
    return "\n".join(x for x in "".join(pieces).splitlines() if x.strip() and not re.match(r"\[\d+\] ", x))


@pytest.mark.parametrize("path,stream", [("/v1/ask", False), ("/v1/ask", True), ("/v1/chat/completions", True)])
def test_a_client_that_leaves_before_the_first_piece_stops_the_prefill(pipeline, backend, path, stream):
    """A client hangs up while its long prompt is evaluated, before any piece
    was written: the engine drops the request at its next step instead of
    evaluating the whole prompt and decoding for nobody (issues 25 and 27)."""
    app = create_app(pipeline, ServiceSettings(rate_limit_per_minute=0, reject_over_target=False))
    s = Server(app)
    loop = backend.loop
    # Each case's question differs from its first word, so none finds another's prompt cached;
    # at about 1,400 tokens it takes three steps of 512 or more.
    question = f"Case {path} {stream}. " + " ".join(f"Is point {n} about prefill?" for n in range(200))
    asked = len(backend.tokenize(question))
    body = {"question": question, "max_tokens": 4, "stream": stream, "max_k": 1} if path == "/v1/ask" else \
        {"messages": [{"role": "user", "content": question}], "max_tokens": 4, "stream": stream}
    payload = json.dumps(body).encode()
    try:
        pipeline.wait_idle()
        _wait(lambda: _engine_idle(app, loop), "the engine was idle before the question")
        before = loop.stats.counters["prefill_tokens"]
        port = int(s.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
            client.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            early = b""

            def started() -> bool:
                nonlocal early
                if select.select([client], [], [], 0)[0]:
                    # The planned prompt's evidence (and a chat stream's opening role, and the answer's
                    # opening: the quoted evidence) may come first; any other text before the engine began
                    # would say the test missed its moment.
                    early += client.recv(4000)
                    if _model_text(early):
                        pytest.fail(f"the server answered: {early!r}")
                return bool(loop.published.active)

            _wait(started, "the engine started on the prompt")
        # Hung up before any piece: nothing but its own disconnect tells the server.
        _wait(lambda: _engine_idle(app, loop), "the engine let the request go")
        prefilled = loop.stats.counters["prefill_tokens"] - before
        assert 0 < prefilled < asked, f"{prefilled} prompt tokens evaluated for a question of {asked}"
    finally:
        s.stop()


def test_simultaneous_requests_with_sessions_all_answer_and_leave_a_consistent_profile(tmp_path, embedder, backend):
    from concurrent.futures import ThreadPoolExecutor

    from prompt_budget.profile import load_profile

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite",
                      profile_dir=tmp_path / "profiles")
    p.ingest([write_corpus(tmp_path / "corpus")])
    p.prepare()
    before = len(p.cost_model.samples)
    s = Server(create_app(p, ServiceSettings(rate_limit_per_minute=0, reject_over_target=False)))
    questions = ["What limits decode?", "How long should bread dough rise?", "What is prefill?"]
    bodies = [{"question": questions[i % 3], "session": f"busy-{i % 4}", "max_tokens": 4} for i in range(12)]
    try:
        with ThreadPoolExecutor(max_workers=12) as pool:
            replies = list(pool.map(lambda b: httpx.post(f"{s.url}/v1/ask", json=b, timeout=300), bodies))
    finally:
        s.stop()
    assert [r.status_code for r in replies] == [200] * 12, [r.text for r in replies if r.status_code != 200]
    p.wait_idle()
    for n in range(4):  # each session's turns are numbered 1, 2, 3: none lost, none twice
        assert [t.number for t in p.conversation(f"busy-{n}").turns] == [1, 2, 3]
    model = p.cost_model
    # Every answer whose prompt was evaluated alone learned from, once (one beside others teaches nothing).
    alone = sum(1 for r in replies if not r.json()["timings"]["shared_prefill"])
    assert len(model.samples) == min(before + alone, 128)
    saved = load_profile(tmp_path / "profiles", backend.profile_key())
    assert saved is not None and len(saved.samples) == len(model.samples)
    p.close()


def test_the_ttft_clock_starts_when_the_question_is_received(tmp_path, embedder, backend):
    from rag.conversations import ConversationStore

    class SlowStore(ConversationStore):
        def load(self, session):
            time.sleep(0.3)  # a slow disk: the asker waits for it too
            return super().load(session)

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend,
                      conversations=SlowStore(tmp_path / "c.sqlite"))
    p.ingest([write_corpus(tmp_path / "corpus")])
    p.prepare()
    answer = p.ask("What limits decode?", session="slow", max_tokens=4)
    assert answer.timings.ttft_s >= 0.3
    p.close()
