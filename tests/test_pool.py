"""A pool of real llama-server engines on 127.0.0.1 behind one backend:
affinity keeps a conversation on its engine, a killed or silent engine loses
no request, an engine dying mid-answer ends the stream with an error event,
and an engine that comes back rejoins."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from engine.backend import Message
from engine.errors import EngineSettingsError
from engine.models import default_model_path
from engine.remote.pool import EnginePool
from engine.remote.backend import RemoteBackend
from rag import Pipeline
from tests.conftest import write_corpus
from tests.llama_server import LlamaServer

from .backend_contract import check_backend

pytestmark = pytest.mark.model


def start(tmp_path_factory, name: str) -> LlamaServer:
    # Two slots of 2,048 tokens each: two conversations can stay cached on one engine.
    return LlamaServer(default_model_path(), n_ctx=4096, slots=2, log=tmp_path_factory.mktemp(name) / "log")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    servers = [start(tmp_path_factory, "engine-a"), start(tmp_path_factory, "engine-b")]
    yield servers
    for server in servers:
        server.stop()


def pool_of(urls, *, policy: str = "affinity", timeout_s: float = 120.0) -> EnginePool:
    # Health checks are called by the tests themselves, so nothing races them.
    return EnginePool(urls, lambda url: RemoteBackend(url, timeout_s=timeout_s), policy=policy, health_interval_s=0)


def pipeline_over(pool, embedder, root) -> Pipeline:
    pipeline = Pipeline(root / "index", embedder=embedder, backend=pool, profile_dir=root / "profiles",
                        conversations=root / "c.sqlite")
    pipeline.ingest([write_corpus(root / "corpus")])
    return pipeline


ASK = {"max_tokens": 12, "target_ttft": 30.0, "max_k": 2}


def test_a_pool_speaks_the_backend_protocol_and_refuses_to_mix_models(engines):
    pool = pool_of([e.url for e in engines])
    try:
        check_backend(pool)
        assert pool.n_ctx == 2048 and [h["healthy"] for h in pool.health()] == [True, True]
        tokens = pool.tokenize(pool.render([Message("user", "Hello")]))
        route = pool.route(tokens)
        assert route.engine in pool.members and route.decision.policy == "affinity"
    finally:
        pool.close()

    class OtherModel(RemoteBackend):
        def describe(self):
            return super().describe() | {"model_path": "/models/another.gguf"}

    with pytest.raises(EngineSettingsError, match="another.gguf"):
        EnginePool([e.url for e in engines], lambda url: (OtherModel if url == engines[1].url else RemoteBackend)(url),
                   health_interval_s=0)


def test_affinity_keeps_each_conversation_on_its_engine_and_round_robin_does_not(engines, embedder, tmp_path):
    pool = pool_of([e.url for e in engines])
    pipeline = pipeline_over(pool, embedder, tmp_path)
    try:
        pipeline.calibrate(quick=True)
        assert len({json.dumps(k.model.fit.coef) for k in (pipeline.desk.keeper(m) for m in pool.members)}) == 2
        answers: dict[str, list] = {"a": [], "b": []}
        for question_a, question_b in (("What is prefill?", "How long does bread bake?"),
                                       ("And what does it fill?", "At what temperature?"),
                                       ("Who feels it?", "What goes into the dough?")):
            answers["a"].append(pipeline.ask(question_a, session="aff-a", **ASK))
            answers["b"].append(pipeline.ask(question_b, session="aff-b", **ASK))
        for turns in answers.values():
            assert len({a.engine["url"] for a in turns}) == 1, [a.engine for a in turns]
            for before, after in zip(turns, turns[1:]):
                assert after.engine["reason"] == "longest prefix"
                # The server's own count: the whole previous prompt was found cached.
                assert after.timings.cached_tokens >= before.timings.prompt_tokens - 2
        pool.policy = "round_robin"
        rr = [pipeline.ask(q, session="rr", **ASK) for q in ("What is decode?", "Why is it slow?", "What limits it?")]
        assert [a.engine["url"] for a in rr][0] != [a.engine["url"] for a in rr][1]
    finally:
        pipeline.close()
        pool.close()


def test_killing_an_engine_mid_run_loses_no_request_and_it_rejoins_when_back(tmp_path_factory, embedder, tmp_path):
    servers = [start(tmp_path_factory, "kill-a"), start(tmp_path_factory, "kill-b")]
    pool = pool_of([s.url for s in servers])
    pipeline = pipeline_over(pool, embedder, tmp_path)
    try:
        first = pipeline.ask("What is prefill?", session="k", **ASK)
        home = next(s for s in servers if s.url == first.engine["url"])
        home.kill()
        # Whichever call meets the dead engine first (routing asks for tokens,
        # or the completion itself), the question is answered elsewhere.
        second = pipeline.ask("And what does it fill?", session="k", **ASK)
        assert second.answer and second.engine["url"] != home.url
        # Recomputed on the other engine, and reported so: the conversation was not cached there.
        assert second.timings.cached_tokens < first.timings.prompt_tokens
        assert [h["healthy"] for h in pool.health()] == [s is not home for s in servers]
        assert any(e["event"] == "down" and e["engine"] == home.url for e in pool.events)
        third = pipeline.ask("Who feels it?", session="k", **ASK)
        assert third.engine["failovers"] == 0 and third.engine["url"] == second.engine["url"]
        # A completion already routed to an engine that dies is retried on another.
        home.restart()
        assert pool.check(pool.members[servers.index(home)])
        assert [h["healthy"] for h in pool.health()] == [True, True]
        tokens = pool.tokenize(pool.render([Message("user", "Say hi.")]))
        route = pool.route(tokens)
        next(s for s in servers if s.url == route.engine.url).kill()
        text, timings = route.generate(tokens, max_tokens=4).result()
        assert text and timings.failovers == 1 == route.report()["failovers"]
        assert route.report()["url"] != route.report()["planned_for"] == route.engine.url
        victim = next(s for s in servers if s.url == route.engine.url)
        victim.restart()
        assert pool.check(route.engine)
        pool.policy = "round_robin"
        served = {pipeline.ask("What is decode?", **ASK).engine["url"] for _ in range(2)}
        assert served == {s.url for s in servers}  # both serve again
    finally:
        pipeline.close()
        pool.close()
        for s in servers:
            s.stop()


def test_an_engine_that_goes_silent_is_left_for_another(tmp_path_factory, embedder, tmp_path):
    servers = [start(tmp_path_factory, "silent-a"), start(tmp_path_factory, "silent-b")]
    pool = pool_of([s.url for s in servers], policy="round_robin", timeout_s=8.0)
    pipeline = pipeline_over(pool, embedder, tmp_path)
    try:
        pipeline.prepare()
        os.kill(servers[0].process.pid, signal.SIGSTOP)  # alive, but answering nothing
        answers = [pipeline.ask("What is prefill?", **ASK) for _ in range(2)]
        assert all(a.answer and a.engine["url"] == servers[1].url for a in answers)
        assert not pool.health()[0]["healthy"] and "timed out" in pool.health()[0]["reason"].lower()
    finally:
        os.kill(servers[0].process.pid, signal.SIGCONT)
        pipeline.close()
        pool.close()
        for s in servers:
            s.stop()


def test_an_engine_dying_mid_answer_ends_the_stream_with_an_error_event(engines, embedder, tmp_path):
    from rag.service import LoopbackServer, ServiceSettings, create_app
    from tests.faults import CuttingProxy

    # Both members sit behind a cutting proxy: which one the question meets
    # depends on how many turns warm-up took, and either must end the stream.
    proxies = [CuttingProxy(e.url) for e in engines]
    pool = pool_of([p.url for p in proxies], policy="round_robin")
    pipeline = pipeline_over(pool, embedder, tmp_path)
    pipeline.prepare()
    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    try:
        for proxy in proxies:
            proxy.cut_after = 3
        body = {"question": "What limits decode?", "max_tokens": 32, "stream": True, "target_ttft_s": 30}
        events = []
        with httpx.stream("POST", f"{server.url}/v1/ask", json=body, timeout=120) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and "evidence" in events[0] and "delta" in events[1] and "error" in events[-1]
        message = events[-1]["error"]["message"]
        dead = next(i for i, p in enumerate(proxies) if p.url in message)
        assert "ask again" in message
        assert [m["healthy"] for m in pool.health()] == [i != dead for i in range(2)]
        for proxy in proxies:
            proxy.cut_after = None
        r = httpx.post(f"{server.url}/v1/ask", json=body | {"stream": False}, timeout=120)
        assert r.status_code == 200 and r.json()["engine"]["url"] == proxies[1 - dead].url
        assert httpx.get(f"{server.url}/healthz").json()["engines"][dead]["healthy"] is False
    finally:
        for proxy in proxies:
            proxy.cut_after = None
        server.stop()
        pipeline.close()
        pool.close()
        for proxy in proxies:
            proxy.stop()


def test_a_member_counts_a_request_in_its_load_from_when_it_is_asked():
    # Not from its first read: a request routed in between must see it (pure logic: a fake engine).
    from engine.fake import FakeBackend

    member = EnginePool(["fake://a"], lambda url: FakeBackend(), health_interval_s=0).members[0]
    generation = member.generate("hello there", max_tokens=4)
    assert member.in_flight == 1 and member.load().waiting + member.load().active
    generation.result()
    assert member.in_flight == 0
    member.generate("hello again", max_tokens=4).close()  # closed unread: not counted for ever
    assert member.in_flight == 0
