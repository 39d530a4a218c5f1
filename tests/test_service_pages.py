"""What the web page needs from the service, on a real server on 127.0.0.1
with the real model: the page without a key, a document's text and file by
id (no path from the client), sessions, the cost model's points and curve,
sources that say where they came from, and a start with no index yet."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from rag import Pipeline
from rag.errors import DocumentNotFound
from rag.ingest.content import file_in
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import CORPUS, write_corpus

KEY = {"Authorization": "Bearer page-key"}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, embedder, backend):
    root = tmp_path_factory.mktemp("pages")
    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus")])
    yield p
    p.close()


@pytest.fixture(scope="module")
def keyed(pipeline):
    s = LoopbackServer(create_app(pipeline, ServiceSettings(api_keys=["page-key"], rate_limit_per_minute=0)))
    yield s
    s.stop()


def _ask(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/ask", json={"max_tokens": 8} | body, headers=KEY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_page_loads_without_a_key_and_the_api_still_needs_one(keyed):
    page = httpx.get(f"{keyed.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for asset in ("/static/app.css", "/static/js/main.js", "/static/js/api.js"):
        assert httpx.get(f"{keyed.url}{asset}").status_code == 200, asset
    assert 'src="/static/js/main.js"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    for path in ("/v1/documents", "/v1/sessions", "/v1/profile"):
        assert httpx.get(f"{keyed.url}{path}").status_code == 401, path
    # A path that starts like the page's files does not reach the API behind them.
    for sneaky in ("/static/../v1/documents", "/static/%2e%2e/v1/documents", "/static/..%2fv1/documents"):
        status, body = _raw_get(keyed.url, sneaky)
        assert status == 404 and b'"documents"' not in body, (sneaky, status, body[:200])


def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` exactly as written (an HTTP client would tidy it first)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_a_source_opens_at_its_span_in_the_document_text(keyed, pipeline):
    answer = _ask(keyed, question="How long should bread dough rise?")
    best = max(answer["sources"], key=lambda s: s["score"])
    assert best["source"] == "guide/cooking.rst" and best["doc_id"]
    r = httpx.get(f"{keyed.url}/v1/documents/{best['doc_id']}/text", headers=KEY)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["current"] is True and doc["pages"] == [] and doc["source"] == "guide/cooking.rst"
    assert doc["text"] == CORPUS["guide/cooking.rst"]
    chunk = {h.chunk_id: h for h in pipeline.search("bread dough rise", k=10)}[best["chunk_id"]]
    assert doc["text"][best["char_start"]:best["char_end"]] == chunk.text
    listed = {d["id"] for d in httpx.get(f"{keyed.url}/v1/documents", headers=KEY).json()["documents"]}
    assert {s["doc_id"] for s in answer["sources"]} <= listed


def test_html_is_served_as_text_never_as_a_page(keyed):
    docs = httpx.get(f"{keyed.url}/v1/documents", headers=KEY).json()["documents"]
    garden = next(d for d in docs if d["source"] == "guide/garden.html")
    r = httpx.get(f"{keyed.url}/v1/documents/{garden['id']}/file", headers=KEY)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.headers["content-security-policy"] == "sandbox" and r.headers["x-content-type-options"] == "nosniff"
    assert r.text == CORPUS["guide/garden.html"]
    text = httpx.get(f"{keyed.url}/v1/documents/{garden['id']}/text", headers=KEY).json()["text"]
    assert "Tomatoes need full sun" in text and "do not index me" not in text  # the indexed text, scripts left out


def test_a_pdf_comes_back_as_a_pdf_and_its_sources_carry_pages(keyed, pdf_bytes):
    r = httpx.post(f"{keyed.url}/v1/documents", files={"file": ("animals.pdf", pdf_bytes)}, headers=KEY, timeout=120)
    assert r.status_code == 200, r.text
    (doc,) = r.json()["documents"]
    got = httpx.get(f"{keyed.url}/v1/documents/{doc['id']}/file", headers=KEY)
    assert got.status_code == 200 and got.headers["content-type"] == "application/pdf" and got.content == pdf_bytes
    text = httpx.get(f"{keyed.url}/v1/documents/{doc['id']}/text", headers=KEY).json()
    assert [p for p, _ in text["pages"]] == [1, 2]
    answer = _ask(keyed, question="Which page talks about alpacas?")
    pages = {s["page"] for s in answer["sources"] if s["doc_id"] == doc["id"]}
    assert pages and pages <= {1, 2}
    httpx.delete(f"{keyed.url}/v1/documents/{doc['id']}", headers=KEY, timeout=120)


@pytest.mark.parametrize("doc_id", ["0123456789abcdef", "..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "x" * 64])
def test_unknown_or_crafted_ids_are_404(keyed, doc_id):
    for kind in ("text", "file"):
        r = httpx.get(f"{keyed.url}/v1/documents/{doc_id}/{kind}", headers=KEY)
        assert r.status_code == 404, (doc_id, kind, r.text)
        assert "root:" not in r.text  # never a file's content


def test_a_source_leading_outside_its_root_is_refused():
    assert str(file_in("/data/docs", "guide/cooking.rst")) == "/data/docs/guide/cooking.rst"
    for source in ("../secret.md", "guide/../../secret.md", "/etc/passwd", "", "."):
        with pytest.raises(DocumentNotFound):
            file_in("/data/docs", source)


def test_a_file_gone_from_disk_is_404_with_what_to_do(keyed, pipeline):
    r = httpx.post(f"{keyed.url}/v1/documents", files={"file": ("brief.md", b"A brief note about owls.\n")},
                   headers=KEY, timeout=120)
    (doc,) = r.json()["documents"]
    (pipeline.library.uploads_dir / "brief.md").unlink()
    r = httpx.get(f"{keyed.url}/v1/documents/{doc['id']}/text", headers=KEY)
    assert r.status_code == 404 and "upload or ingest it again" in r.json()["error"]["message"]
    httpx.delete(f"{keyed.url}/v1/documents/{doc['id']}", headers=KEY, timeout=120)


def test_sessions_are_listed_shown_and_reset(keyed, pipeline):
    _ask(keyed, question="What limits decode?", session="page-s1")
    _ask(keyed, question="And prefill?", session="page-s1")
    listed = httpx.get(f"{keyed.url}/v1/sessions", headers=KEY).json()["sessions"]
    mine = next(s for s in listed if s["session"] == "page-s1")
    assert mine["turns"] == 2 and mine["updated"] > 0
    shown = httpx.get(f"{keyed.url}/v1/sessions/page-s1", headers=KEY).json()
    assert [t["question"] for t in shown["turns"]] == ["What limits decode?", "And prefill?"]
    assert shown["turns"][0]["sources"][0]["doc_id"]
    assert httpx.delete(f"{keyed.url}/v1/sessions/page-s1", headers=KEY).json() == {"reset": "page-s1"}
    assert "page-s1" not in {s["session"] for s in httpx.get(f"{keyed.url}/v1/sessions", headers=KEY).json()["sessions"]}
    assert httpx.get(f"{keyed.url}/v1/sessions/page-s1", headers=KEY).status_code == 404
    assert httpx.delete(f"{keyed.url}/v1/sessions/page-s1", headers=KEY).status_code == 404
    assert pipeline.conversation("page-s1").turns == ()
    bad = httpx.get(f"{keyed.url}/v1/sessions/bad%20id", headers=KEY)
    assert bad.status_code == 400 and "session id" in bad.json()["error"]["message"]


def test_the_profile_has_measured_points_and_the_fitted_curve(keyed, pipeline):
    _ask(keyed, question="What is prefill?")
    view = httpx.get(f"{keyed.url}/v1/profile", headers=KEY).json()
    model = pipeline.cost_model
    assert view["fit"]["form"] == model.fit.form and view["fit"]["coef"] == list(model.fit.coef)
    kinds = {p["kind"] for p in view["points"]}
    assert kinds == {"calibration", "answer"}
    assert len(view["points"]) == len(model.anchors) + len(model.samples)
    curve = view["curve"]
    assert curve[-1]["tokens"] >= pipeline.backend.n_ctx
    assert all(a["prefill_s"] <= b["prefill_s"] for a, b in zip(curve, curve[1:]))
    assert all(c["ttft_s"] == pytest.approx(c["prefill_s"] + view["overhead_s"]) for c in curve)
    assert view["key"] == json.loads(json.dumps(pipeline.backend.profile_key(), default=str))


def test_serve_starts_with_no_index_and_the_first_upload_makes_one(run, tmp_path, monkeypatch):
    import uvicorn

    started = {}
    real_run = uvicorn.Server.run

    def capture(self, sockets=None):  # serve()'s server is kept, not run; the loopback one below runs
        if "app" in started:
            return real_run(self, sockets)
        started["app"] = self.config.app

    monkeypatch.setattr(uvicorn.Server, "run", capture)
    result = run("serve", "--index", tmp_path / "none-yet", "--port", "0")  # as a new user would, before any ingest
    assert result.exit_code == 0, result.output
    app = started["app"]
    s = LoopbackServer(app)
    try:
        assert httpx.get(f"{s.url}/").status_code == 200
        assert httpx.get(f"{s.url}/v1/documents").status_code == 404  # no index yet: nothing listed
        r = httpx.post(f"{s.url}/v1/documents", files={"file": ("first.md", b"Owls hunt at night.\n")}, timeout=120)
        assert r.status_code == 200, r.text
        answer = httpx.post(f"{s.url}/v1/ask", json={"question": "When do owls hunt?", "max_tokens": 4}, timeout=120)
        assert answer.status_code == 200 and answer.json()["sources"][0]["source"] == "first.md"
    finally:
        s.stop()
        app.state.pipeline.close()
