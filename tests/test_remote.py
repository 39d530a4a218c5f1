"""The remote backend against a real llama-server on 127.0.0.1, serving the
same GGUF as the in-process backend; and the memory plan before a load."""

from __future__ import annotations

import pytest

from engine.backend import ContextOverflow, Message, Timings
from engine.llama_cpp.memory import InsufficientMemory, ModelShape, check_fits, largest_context
from engine.models import default_model_path
from prompt_budget import PromptShape
from engine.errors import EngineSettingsError, EngineUnreachable, ModelFileError
from engine.remote.backend import RemoteBackend
from engine.remote.llama_server import LlamaServer
from rag import EngineUnavailable, Pipeline

from .backend_contract import check_backend

pytestmark = pytest.mark.model

MESSAGES = [Message("system", "You answer briefly."), Message("user", "What is prefill?")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """llama-server built from llama-cpp-python's own llama.cpp sources, serving the bundled model."""
    server = LlamaServer(default_model_path(), n_ctx=2048, log=tmp_path_factory.mktemp("server") / "log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote(server):
    backend = RemoteBackend(server.url)
    yield backend
    backend.close()


def test_remote_backend_speaks_the_protocol_with_the_models_template_and_tokens(remote, backend):
    check_backend(remote)
    assert remote.kind == "llama-server" and remote.n_ctx == 2048
    prompt = remote.render(MESSAGES)
    # The server applies the GGUF's own template and tokenizer: the same as in process.
    assert prompt == backend.render(MESSAGES)
    assert remote.tokenize(prompt) == backend.tokenize(prompt)


def test_remote_timings_come_from_the_server_and_a_repeated_prefix_is_cached(remote):
    tokens = remote.tokenize(remote.render(MESSAGES))
    text, first = remote.generate(tokens, max_tokens=8).result()
    assert text.strip() and isinstance(first, Timings)
    assert first.prompt_tokens == len(tokens) == first.cached_tokens + first.prefill_tokens
    assert first.prefill_s > 0 and 0 < first.decode_tokens <= 8 and first.decode_s > 0
    assert remote.cached_prefix(tokens) == len(tokens) - 1
    longer = remote.tokenize(remote.render([MESSAGES[0], Message("user", "What is prefill? Say it in French.")]))
    predicted = remote.cached_prefix(longer)
    _, second = remote.generate(longer, max_tokens=4).result()
    # The server's own cache_n: the shared prefix was not evaluated again.
    assert second.cached_tokens >= predicted > 10
    assert second.prefill_tokens == len(longer) - second.cached_tokens


def test_the_server_decodes_nothing_after_a_stop_sequence(remote):
    tokens = remote.tokenize(remote.render(MESSAGES))
    free = remote.generate(tokens, max_tokens=16).result()[0]
    stop = free.split()[2]  # a word the greedy answer certainly writes, a few tokens in
    text, timings = remote.generate(tokens, max_tokens=64, stop=(stop,)).result()
    assert free.startswith(text) and stop not in text  # the server withholds the stop's own text
    # The server's own count: the tokens up to the stop, none after it.
    assert timings.decode_tokens <= len(remote.tokenize(free[: free.index(stop) + len(stop)])) + 1 < 16


def test_remote_refuses_a_prompt_over_its_context_before_sending(remote):
    with pytest.raises(ContextOverflow):
        remote.generate([1] * 2040, max_tokens=16)


def test_pipeline_over_the_remote_server_calibrates_answers_and_learns(remote, embedder, corpus, tmp_path):
    pipeline = Pipeline(tmp_path / "index", embedder=embedder, backend=remote, profile_dir=tmp_path / "profiles",
                        conversations=tmp_path / "c.sqlite")
    pipeline.ingest([corpus])
    profile = pipeline.calibrate(quick=True)
    assert profile.key["engine"] == "remote:llama-server" and profile.cost_model().predict(PromptShape(500)) > 0
    answer = pipeline.ask("What limits decode speed?", target_ttft=5.0, max_tokens=16)
    assert answer.sources and answer.timings.prompt_tokens > 0
    assert answer.timings.cached_tokens + answer.timings.prefill_tokens == answer.timings.prompt_tokens
    before = len(pipeline.cost_model.samples)
    pipeline.ask("How long does bread bake?", target_ttft=5.0, max_tokens=8)
    assert len(pipeline.cost_model.samples) == before + 1  # learnt from the server's own timings
    pipeline.close()


def test_an_unreachable_server_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EngineUnreachable, match="did not answer"):
        RemoteBackend(f"http://127.0.0.1:{port}")
    from rag.settings import Settings

    pipeline = Pipeline(tmp_path / "index", settings=Settings.load(engine_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(EngineUnavailable, match=f"127.0.0.1:{port}"):
        pipeline.backend


SMOLLM2 = {
    "general.architecture": "llama", "llama.block_count": "30", "llama.attention.head_count": "9",
    "llama.attention.head_count_kv": "3", "llama.embedding_length": "576", "llama.context_length": "8192",
}


def test_kv_cache_size_follows_the_formula_from_the_metadata():
    shape = ModelShape.from_metadata(SMOLLM2)
    assert (shape.n_layers, shape.n_head_kv, shape.key_dim) == (30, 3, 64)
    # 2 x layers x kv_heads x head_dim x 2 bytes: 22.5 KiB a token, as measured for its snapshots.
    assert shape.kv_bytes_per_token("f16") == 2 * 30 * 3 * 64 * 2 == 23040
    assert shape.kv_bytes(4096, "q8_0") == pytest.approx(shape.kv_bytes(4096, "f16") * 34 / 64)
    assert shape.kv_bytes(1000) == shape.kv_bytes(1024)  # padded as llama.cpp pads
    with pytest.raises(ModelFileError, match="head_count"):
        ModelShape.from_metadata({"general.architecture": "llama", "llama.block_count": "2"})


def test_a_context_that_does_not_fit_names_one_that_does():
    shape = ModelShape.from_metadata(SMOLLM2 | {"llama.context_length": "0"})
    free, weights = 2 << 30, 100 << 20
    with pytest.raises(InsufficientMemory, match=r"n_ctx=\d+ would fit") as err:
        check_fits(shape, 200_000, kv_type="f16", weight_bytes=weights, free_bytes=free, where="RAM")
    fits = int(str(err.value).split("n_ctx=")[1].split()[0])
    assert fits == largest_context(shape, free, weights) and fits % 256 == 0
    assert check_fits(shape, fits, kv_type="f16", weight_bytes=weights, free_bytes=free, where="RAM") > weights
    with pytest.raises(InsufficientMemory):
        check_fits(shape, fits + 256, kv_type="f16", weight_bytes=weights, free_bytes=free, where="RAM")
    assert largest_context(shape, free, weights, "q8_0") > fits  # the hint names q8_0 too
    assert largest_context(ModelShape.from_metadata(SMOLLM2), 1 << 40, weights) == 8192  # the training context caps it


def test_the_in_process_backend_checks_memory_before_loading():
    from engine.llama_cpp.backend import LlamaCppBackend

    with pytest.raises(InsufficientMemory, match=r"n_ctx=\d+ would fit"):
        LlamaCppBackend(n_ctx=50_000_000)  # a 1 TB KV cache: refused before llama.cpp allocates
    with pytest.raises(EngineSettingsError, match="flash attention"):
        LlamaCppBackend(kv_type="q8_0", flash_attn=False)


def test_a_q8_kv_cache_with_flash_attention_answers_in_half_the_memory(backend):
    from engine.llama_cpp.backend import LlamaCppBackend

    q8 = LlamaCppBackend(n_ctx=2048, kv_type="q8_0")
    info = q8.describe()
    assert info["kv_type"] == "q8_0" and info["flash_attn"] is True
    assert info["kv_cache_bytes"] < 0.6 * backend.describe()["kv_cache_bytes"]
    assert q8.profile_key()["kv_type"] == "q8_0" and "kv_type" not in backend.profile_key()
    text, timings = q8.generate(q8.tokenize(q8.render(MESSAGES)), max_tokens=8).result()
    assert text.strip() and timings.decode_tokens > 0


@pytest.fixture(scope="module")
def cut_pipeline(server, embedder, tmp_path_factory):
    """A pipeline over the real llama-server through a proxy that can cut
    its answers off midway, with a calibrated profile and an index."""
    from rag.settings import Settings
    from tests.conftest import write_corpus
    from tests.faults import CuttingProxy

    root = tmp_path_factory.mktemp("cut")
    proxy = CuttingProxy(server.url)
    settings = Settings.load(engine_url=proxy.url, index=root / "index", cache_dir=root / "cache",
                             conversations=root / "c.sqlite")
    pipeline = Pipeline.open(settings=settings, embedder=embedder)
    pipeline.ingest([write_corpus(root / "corpus")])
    pipeline.calibrate(quick=True)
    yield pipeline, proxy, settings
    proxy.cut_after = None
    pipeline.close()
    proxy.stop()


def test_an_engine_dying_mid_answer_is_a_clear_error_in_the_api_and_the_cli(cut_pipeline, embedder, monkeypatch):
    from typer.testing import CliRunner

    from rag import cli

    pipeline, proxy, settings = cut_pipeline
    proxy.cut_after = 2
    stream = pipeline.stream("What limits decode speed?", max_tokens=32)
    with pytest.raises(EngineUnavailable, match="broke off"):
        for _ in stream:
            pass
    monkeypatch.setattr(cli.common, "open_pipeline",
                        lambda s, **options: Pipeline.open(settings=s, embedder=embedder, **options))
    result = CliRunner().invoke(cli.app, ["--engine-url", proxy.url, "ask", "What limits decode speed?",
                                          "--index", str(settings.index), "--max-tokens", "32"],
                                env={"RAG_CACHE_DIR": str(settings.cache_dir)})
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")], (result.stderr, repr(result.exception))


def test_an_engine_dying_mid_answer_is_a_json_error_or_an_error_event(cut_pipeline):
    import json

    import httpx

    from rag.service import LoopbackServer, ServiceSettings, create_app

    pipeline, proxy, _ = cut_pipeline
    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    try:
        proxy.cut_after = 2
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "What limits decode?", "max_tokens": 32}, timeout=120)
        assert r.status_code == 503 and r.json()["error"]["type"] == "engine_unavailable"
        for path, body in (("/v1/ask", {"question": "What limits decode?", "max_tokens": 32, "stream": True}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What limits decode?"}],
                                                     "max_tokens": 32, "stream": True})):
            proxy.cut_after = 3
            with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
                lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            events = [json.loads(x) for x in lines if x != "[DONE]"]
            assert r.status_code == 200 and "error" in events[-1], (path, events[-3:])
            assert "Traceback" not in events[-1]["error"]["message"]
        proxy.cut_after = None
        r = httpx.post(f"{server.url}/v1/ask", json={"question": "What limits decode?", "max_tokens": 4}, timeout=120)
        assert r.status_code == 200  # the service carries on once the engine answers again
    finally:
        proxy.cut_after = None
        server.stop()
