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


def test_a_warm_up_that_fails_with_a_database_error_says_so_and_is_tried_a_bounded_number_of_times(
        tmp_path, pipeline_factory, monkeypatch):
    import sqlite3

    from rag.service import warmup

    monkeypatch.setattr(warmup, "RETRY_BACKOFF_S", 0.0, raising=False)  # the tries are counted, not timed
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    tried: list[int] = []

    def locked():  # deep in the warm-up path: loading the engines' cost models
        tried.append(1)
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(p.desk, "prepare", locked)
    server = LoopbackServer(create_app(p), ready=True)
    try:
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "error", health.json()
        assert "database is locked" in health.json()["error"]
        for _ in range(5):
            r = httpx.post(f"{server.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 2}, timeout=60)
            assert r.status_code == 503 and "database is locked" in r.json()["error"]["message"], r.text
        assert len(tried) == warmup.WARM_UP_TRIES  # not once more for each request
    finally:
        server.stop()
        p.close()


def test_an_os_error_in_the_warm_up_is_caught_and_a_later_try_succeeds(tmp_path, pipeline_factory, monkeypatch):
    from rag.service import warmup

    monkeypatch.setattr(warmup, "RETRY_BACKOFF_S", 0.0, raising=False)
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    prepare, tried = p.desk.prepare, []

    def flaky():  # the first try meets a full disk; the next one does not
        tried.append(1)
        if len(tried) == 1:
            raise OSError(28, "No space left on device")
        prepare()

    monkeypatch.setattr(p.desk, "prepare", flaky)
    server = LoopbackServer(create_app(p), ready=True)
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "ok" and len(tried) == 2, health
        assert p.desk.warmed
    finally:
        server.stop()
        p.close()


def test_a_failed_prefill_leaves_the_system_prompt_unwarmed_and_the_next_warm_up_tries_again(
        tmp_path, pipeline_factory, backend, monkeypatch):
    from engine.backend import PrefixCache
    from rag.errors import RagError

    assert isinstance(backend, PrefixCache)
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    prefill, calls = backend.prefill, []

    def failing(*args, **kwargs):
        calls.append(1)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(backend, "prefill", failing)
    try:
        try:
            p.warm_up()
        except (OSError, RagError):
            pass
        assert calls == [1] and not p.desk.warmed  # it did not happen: not marked as done
    finally:
        monkeypatch.setattr(backend, "prefill", prefill)
    seen = []
    monkeypatch.setattr(backend, "prefill", lambda *a, **k: seen.append(1) or prefill(*a, **k))
    p.prepare(need_index=False)
    assert seen == [1] and p.desk.warmed  # tried again, and now it holds
    p.close()
