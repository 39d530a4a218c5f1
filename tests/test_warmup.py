"""Warming up before the first question: the service listens at once, says
"warming" on /healthz, and answers nothing until the pipeline is prepared;
ingest gives way to questions being answered."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np

from rag.ingest.embed import GivingWay
from rag.service import LoopbackServer, create_app

from .conftest import write_corpus


def test_the_service_says_warming_and_answers_only_once_warm(tmp_path, pipeline_factory, monkeypatch):
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    p.ingest([write_corpus(tmp_path / "corpus")])
    release = threading.Event()
    prepare = p.prepare

    def held_prepare(**kwargs):  # the real warm-up, held back until the test has looked
        release.wait(60)
        prepare(**kwargs)

    monkeypatch.setattr(p, "prepare", held_prepare)
    server = LoopbackServer(create_app(p), ready=False)
    try:
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "warming"
        answered: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: answered.append(httpx.post(
            f"{server.url}/v1/ask", json={"question": "What does prefill do?", "max_tokens": 4}, timeout=120)))
        asking.start()
        asking.join(1.0)
        assert not answered  # held until the warm-up ends, not answered cold
        release.set()
        asking.join(120)
        assert answered and answered[0].status_code == 200, answered
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "ok" and health["warm_up_s"] > 0
        assert p.desk.warmed
    finally:
        release.set()
        server.stop()
        p.close()


def test_ingest_embeds_in_groups_that_wait_while_a_question_is_answered(embedder):
    busy = threading.Event()
    busy.set()
    way = GivingWay(embedder, busy.is_set, max_wait_s=30)
    threading.Timer(0.3, busy.clear).start()  # the question is answered
    texts = [f"sentence number {i} about owls" for i in range(GivingWay.GROUP + 3)]
    began = time.monotonic()
    vectors = way.embed(texts)
    assert way.waited_s > 0 and time.monotonic() - began >= way.waited_s
    assert np.allclose(vectors, embedder.embed(texts), atol=1e-5)
    assert way.name == embedder.name and way.count_tokens("owls") == embedder.count_tokens("owls")


def test_a_steady_stream_of_questions_slows_ingest_but_never_stops_it(embedder):
    way = GivingWay(embedder, lambda: True, max_wait_s=0.05)
    assert way.embed(["one", "two"]).shape == (2, embedder.dim) and way.waited_s >= 0.05
