"""Warming up before the first question: the service listens at once, says
"warming" on /healthz, and answers nothing until the pipeline is prepared;
ingest gives way to questions being answered."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

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
        assert p.engine_setup.warmed
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


HANG_S = 60  # a hang guard, not a timing claim: nothing here takes a fraction of it


def _until(condition, what: str) -> None:
    """Wait until ``condition()`` holds (a hang guard, not a timing claim)."""
    guard, deadline = threading.Event(), time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        guard.wait(0.01)


def test_a_warm_up_that_fails_says_so_refuses_at_once_and_heals_once_its_cause_is_gone(
        tmp_path, pipeline_factory, monkeypatch):
    import sqlite3

    from rag.service import warmup

    # The tries are counted, not timed: no wait between them.
    monkeypatch.setattr(warmup, "RETRY_BACKOFF_S", 0.0, raising=False)
    monkeypatch.setattr(warmup, "RETRY_BACKOFF_MAX_S", 0.0, raising=False)
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    prepare, tried = p.engine_setup.prepare, []
    locked, retrying, release = [True], threading.Event(), threading.Event()

    def setup_prepare():  # deep in the warm-up path: loading the engines' cost models
        tried.append(1)
        if len(tried) > warmup.WARM_UP_TRIES:  # a try after "error" was said: held until the test has looked
            retrying.set()
            assert release.wait(HANG_S)
        if locked[0]:
            raise sqlite3.OperationalError("database is locked")
        prepare()

    monkeypatch.setattr(p.engine_setup, "prepare", setup_prepare)
    server = LoopbackServer(create_app(p), ready=True)
    try:
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "error", health.json()
        assert "database is locked" in health.json()["error"]
        # Not given up for good: tried again in the background while "error" is said.
        assert retrying.wait(HANG_S), f"no try after the first {warmup.WARM_UP_TRIES}: {len(tried)} in all"
        for _ in range(5):
            r = httpx.post(f"{server.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 2}, timeout=60)
            assert r.status_code == 503 and "database is locked" in r.json()["error"]["message"], r.text
        assert len(tried) == warmup.WARM_UP_TRIES + 1  # the background's try, not once more for each request
        locked[0] = False  # the database comes back
        release.set()
        _until(lambda: httpx.get(f"{server.url}/healthz").json()["status"] == "ok", "healthy again")
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "What is prefill?", "max_tokens": 2}, timeout=120)
        assert r.status_code != 503, r.text
        assert len(tried) == warmup.WARM_UP_TRIES + 1 and p.engine_setup.warmed  # healed by that one try
    finally:
        release.set()
        server.stop()
        p.close()


def test_the_wait_between_tries_doubles_up_to_its_cap():
    from rag.service import warmup

    waits = [warmup.retry_wait_s(n) for n in range(1, 12)]
    assert waits[0] == warmup.RETRY_BACKOFF_S and waits[1] == 2 * warmup.RETRY_BACKOFF_S
    assert all(b == min(2 * a, warmup.RETRY_BACKOFF_MAX_S) for a, b in zip(waits, waits[1:]))
    assert waits[-1] == warmup.RETRY_BACKOFF_MAX_S  # capped: a service that comes up late is found soon


class _FailingPipeline:
    """A pipeline whose ``prepare`` fails for the quick tries, then waits until told to stop (a unit-test fake)."""

    def __init__(self) -> None:
        self.calls, self.stopped = 0, threading.Event()

    def prepare(self, **_):
        self.calls += 1
        from rag.service import warmup

        if self.calls > warmup.WARM_UP_TRIES:
            self.stopped.wait(HANG_S)
        raise ConnectionRefusedError("the remote engine is not up")


def test_each_refused_request_gets_an_exception_of_its_own(monkeypatch):
    # One exception instance raised for every request grows its traceback for the life of the process.
    import asyncio

    from rag.service import warmup

    monkeypatch.setattr(warmup, "RETRY_BACKOFF_S", 0.0, raising=False)
    monkeypatch.setattr(warmup, "RETRY_BACKOFF_MAX_S", 0.0, raising=False)
    pipeline = _FailingPipeline()
    w = warmup.WarmUp(pipeline)
    try:
        assert w.wait(HANG_S) and w.status == "error"
        raised = []
        for _ in range(3):
            with pytest.raises(warmup.WarmUpFailed, match="not up") as caught:
                asyncio.run(w.ready())
            raised.append(caught.value)
        assert len({id(e) for e in raised}) == 3 and all(e is not w.error for e in raised)
        depth = [len(list(_frames(e.__traceback__))) for e in raised]
        assert depth[0] == depth[-1], depth  # nothing piles up on one traceback
    finally:
        pipeline.stopped.set()
        w.stop()


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_an_os_error_in_the_warm_up_is_caught_and_a_later_try_succeeds(tmp_path, pipeline_factory, monkeypatch):
    from rag.service import warmup

    monkeypatch.setattr(warmup, "RETRY_BACKOFF_S", 0.0, raising=False)
    monkeypatch.setattr(warmup, "RETRY_BACKOFF_MAX_S", 0.0, raising=False)
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite")
    prepare, tried = p.engine_setup.prepare, []

    def flaky():  # the first try meets a full disk; the next one does not
        tried.append(1)
        if len(tried) == 1:
            raise OSError(28, "No space left on device")
        prepare()

    monkeypatch.setattr(p.engine_setup, "prepare", flaky)
    server = LoopbackServer(create_app(p), ready=True)
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "ok" and len(tried) == 2, health
        assert p.engine_setup.warmed
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
        assert calls == [1] and not p.engine_setup.warmed  # it did not happen: not marked as done
    finally:
        monkeypatch.setattr(backend, "prefill", prefill)
    seen = []
    monkeypatch.setattr(backend, "prefill", lambda *a, **k: seen.append(1) or prefill(*a, **k))
    p.prepare(need_index=False)
    assert seen == [1] and p.engine_setup.warmed  # tried again, and now it holds
    p.close()
