"""What the service tells a web client, on a real server on 127.0.0.1 with
the real model (issue 38): no error of the JSON API names a command to type
in a shell; a question asked while the first upload is still on its way
waits for its ingest (or, past its patience, says the document is still
being indexed); the conversations listed are those of the index served."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from rag import Pipeline
from rag.conversations import index_key, open_store
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import CORPUS, write_corpus

# What a shell instruction looks like in a message: a command in backticks, a rag subcommand, pip.
COMMAND = re.compile(r"`|\brag (ingest|ask|search|serve|server|chat|calibrate|doctor|bench)\b|pip install")
BOUNDARY = "rag-test-boundary"
OWLS = b"Owls hunt at night and sleep through the day.\n"


@pytest.fixture
def fresh(tmp_path, embedder, backend):
    """A server over an index that does not exist yet, as `rag serve` starts; its state."""
    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, conversations=tmp_path / "c.sqlite")
    p.prepare(need_index=False)
    app = create_app(p, ServiceSettings(rate_limit_per_minute=0))
    s = LoopbackServer(app)
    yield s, app.state.service
    s.stop()
    p.close()


def _until(condition, guard_s: float = 60) -> None:
    """Wait until ``condition()`` holds (the guard only stops a hang)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == kind, err
    assert not COMMAND.search(err["message"]), err["message"]
    return err["message"]


class HeldUpload:
    """``name`` uploaded in a thread with its body held back after the first
    bytes until :meth:`release`: the server has the request, not yet the file."""

    def __init__(self, url: str, name: str, data: bytes) -> None:
        self._go = threading.Event()
        head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                "Content-Type: text/markdown\r\n\r\n").encode()
        tail = data + f"\r\n--{BOUNDARY}--\r\n".encode()

        def body():
            yield head
            self._go.wait(60)
            yield tail

        self.response: httpx.Response | None = None
        headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        self._thread = threading.Thread(target=lambda: setattr(self, "response", httpx.post(
            f"{url}/v1/documents", content=body(), headers=headers, timeout=120)))
        self._thread.start()

    def release(self) -> httpx.Response:
        """Send the rest of the file; the upload's response."""
        self._go.set()
        self._thread.join(timeout=120)
        return self.response


def test_a_question_asked_while_the_first_upload_is_on_its_way_waits_for_its_ingest(fresh):
    server, state = fresh
    upload = HeldUpload(server.url, "owls.md", OWLS)
    _until(lambda: state.uploads.in_flight == 1)
    asked: dict[str, httpx.Response] = {}
    asking = threading.Thread(target=lambda: asked.update(r=httpx.post(
        f"{server.url}/v1/ask", json={"question": "When do owls hunt?", "max_tokens": 4}, timeout=120)))
    asking.start()
    _until(lambda: state.uploads.questions_waiting == 1)  # it waits, rather than failing for want of an index
    assert "r" not in asked
    assert upload.release().status_code == 200, upload.response.text
    asking.join(timeout=120)
    assert asked["r"].status_code == 200, asked["r"].text
    assert asked["r"].json()["sources"][0]["source"] == "owls.md"


def test_past_its_patience_a_waiting_question_says_the_document_is_still_being_indexed(fresh, monkeypatch):
    import rag.service.uploads as uploads

    server, state = fresh
    monkeypatch.setattr(uploads, "FIRST_INDEX_WAIT_S", 0.0)
    upload = HeldUpload(server.url, "owls.md", OWLS)
    try:
        _until(lambda: state.uploads.in_flight == 1)
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "When do owls hunt?", "max_tokens": 4}, timeout=120)
        assert "still being indexed" in _error(r, 409, "indexing") and r.headers["Retry-After"]
    finally:
        assert upload.release().status_code == 200
    r = httpx.post(f"{server.url}/v1/ask", json={"question": "When do owls hunt?", "max_tokens": 4}, timeout=120)
    assert r.status_code == 200, r.text


def test_no_error_of_the_json_api_names_a_command(fresh):
    server, state = fresh
    url = server.url
    ask = {"question": "What limits decode?", "max_tokens": 4}
    # No index yet, nothing on its way.
    assert "upload" in _error(httpx.post(f"{url}/v1/ask", json=ask, timeout=120), 409, "no_documents")
    assert "upload" in _error(httpx.post(f"{url}/v1/ask", json=ask | {"stream": True}, timeout=120), 409,
                              "no_documents")
    _error(httpx.post(f"{url}/v1/search", json={"query": "decode"}, timeout=120), 409, "no_documents")
    _error(httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "decode?"}]},
                      timeout=120), 409, "no_documents")
    _error(httpx.get(f"{url}/v1/documents", timeout=60), 404, "not_found")
    # An index whose every generation is gone: damaged, to be rebuilt on the server.
    assert httpx.post(f"{url}/v1/documents", files={"file": ("decode.txt", CORPUS["decode.txt"].encode())},
                      timeout=120).status_code == 200
    index = state.pipeline.index_location
    for generation in index.glob("gen-*"):
        for f in sorted(generation.rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        generation.rmdir()
    (index / "CURRENT").write_text("gen-000099\n")  # a new name: the server opens the index again
    message = _error(httpx.post(f"{url}/v1/ask", json=ask, timeout=120), 503, "index_damaged")
    assert "rebuilt on the server" in message
    _error(httpx.post(f"{url}/v1/search", json={"query": "decode"}, timeout=120), 503, "index_damaged")


def test_the_sessions_listed_are_those_of_the_index_served(tmp_path, embedder, backend):
    store = tmp_path / "c.sqlite"  # one conversation store, two indexes
    pipelines = {}
    for name in ("a", "b"):
        p = Pipeline.open(tmp_path / name, embedder=embedder, backend=backend, conversations=store)
        p.ingest([write_corpus(tmp_path / f"corpus-{name}")])
        pipelines[name] = p
    legacy = open_store(store)
    legacy.append_next("before-indexes", "q?", "q?", "a.", 3)  # as a store of schema 1 held it: no index
    legacy.close()
    pipelines["a"].ask("What limits decode?", session="asked-in-a", max_tokens=4)
    s = LoopbackServer(create_app(pipelines["b"], ServiceSettings(rate_limit_per_minute=0)))
    try:
        r = httpx.post(f"{s.url}/v1/ask", json={"question": "What is prefill?", "session": "asked-in-b",
                                               "max_tokens": 4}, timeout=120)
        assert r.status_code == 200, r.text
        listed = [x["session"] for x in httpx.get(f"{s.url}/v1/sessions", timeout=60).json()["sessions"]]
        assert listed == ["asked-in-b"]
        # Another index's conversation is still there by its id; continued here, it stays A's.
        assert httpx.get(f"{s.url}/v1/sessions/asked-in-a", timeout=60).json()["turns"]
        # One from before indexes were recorded is listed where it is next continued.
        r = httpx.post(f"{s.url}/v1/ask", json={"question": "And decode?", "session": "before-indexes",
                                               "max_tokens": 4}, timeout=120)
        assert r.status_code == 200, r.text
        listed = {x["session"] for x in httpx.get(f"{s.url}/v1/sessions", timeout=60).json()["sessions"]}
        assert listed == {"asked-in-b", "before-indexes"}
        assert [x["session"] for x in pipelines["a"].memory.sessions()] == ["asked-in-a"]
        every = {x["session"] for x in pipelines["a"].conversations.sessions()}
        assert every == {"asked-in-a", "asked-in-b", "before-indexes"}
        assert index_key(tmp_path / "b") == str((tmp_path / "b").resolve())
    finally:
        s.stop()
        for p in pipelines.values():
            p.close()
