"""The service client (rag.service.client): a `rag serve` elsewhere, reached
over HTTP with its key, answers `rag ask` and `rag search` as a pipeline here
would; the answerer protocol holds for it (a real server on 127.0.0.1, the
real model)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

import pytest

from rag.errors import RagError
from rag.qa.answerer import Answerer
from rag.qa.options import AskOptions
from rag.qa.stream import AnswerDone, EvidenceFound, TextPiece
from rag.service import LoopbackServer, ServiceSettings, create_app
from rag.service.client import ServiceClient
from rag.settings import Settings

from .conftest import prepared_pipeline


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedder, backend):
    pipeline = prepared_pipeline(tmp_path_factory.mktemp("served"), embedder, backend)
    server = LoopbackServer(create_app(pipeline, ServiceSettings(api_keys=["the-key"], rate_limit_per_minute=0)))
    yield server
    server.stop()
    pipeline.close()


def test_the_service_client_answers_as_the_pipeline_does(served):
    client = ServiceClient(served.url, Settings(target_ttft=None), key="the-key")
    assert isinstance(client, Answerer) and client.via == "service"
    with client.stream("What does prefill do?", AskOptions.of(max_tokens=8, max_k=2)) as stream:
        events = list(stream.events())
    answer = stream.answer
    assert isinstance(events[0], EvidenceFound) and all(isinstance(e, TextPiece) for e in events[1:-1])
    assert isinstance(events[-1], AnswerDone) and events[-1].answer is answer
    assert "".join(e.text for e in events[1:-1]) == answer.answer and answer.sources
    assert answer.budget.target_ttft is None and answer.budget.chosen <= 2  # this side's options, sent
    hits = client.search("prefill", k=2)
    assert len(hits) == 2 and hits[0].text
    assert {d["source"] for d in client.documents()} >= {h.source for h in hits}
    client.close()


def test_a_wrong_key_or_no_server_is_one_clear_error(served):
    with pytest.raises(RagError, match="key"):
        ServiceClient(served.url, Settings(), key="not-it").search("prefill")
    with pytest.raises(RagError, match="does not answer"):
        ServiceClient("http://127.0.0.1:9", Settings()).search("prefill")  # the discard port: nothing listens
    with _web_page_server() as url, pytest.raises(RagError, match="is it a rag server"):
        ServiceClient(url, Settings()).documents()  # a web server that is not rag's: one clear error


@contextlib.contextmanager
def _web_page_server():
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>a page</html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_rag_ask_and_search_go_to_the_named_service(served, run, monkeypatch):
    monkeypatch.setenv("RAG_SERVICE_KEY", "the-key")
    asked = run("--service-url", served.url, "ask", "What does prefill do?", "--max-tokens", "4", "--json")
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout)["sources"]
    found = run("--service-url", served.url, "search", "prefill", "-k", "1", "--json")
    assert found.exit_code == 0 and len(json.loads(found.stdout)["results"]) == 1
    bad = run("--service-url", "ftp://nowhere", "search", "prefill")
    assert bad.exit_code != 0 and "--service-url" in bad.output


def test_the_langchain_retriever_reads_a_servers_budget(served):
    from rag.integrations.langchain import BudgetedRetriever

    client = ServiceClient(served.url, Settings(), key="the-key")
    chosen = client.budgeted("What does prefill do?", max_k=2, target_ttft=30.0)
    assert 1 <= len(chosen.hits) <= 2 and chosen.budget.chosen == len(chosen.hits)
    assert chosen.budget.target_ttft == 30.0  # the options this side sent
    documents = BudgetedRetriever(pipeline=client, max_k=2, target_ttft=30.0).invoke("What does prefill do?")
    assert [d.metadata["chunk_id"] for d in documents] == [h.chunk_id for h in chosen.hits]
    with pytest.raises(RagError, match="key"):
        ServiceClient(served.url, Settings(), key="not-it").budgeted("What does prefill do?")
