"""The remote backend against a real llama-server on 127.0.0.1, serving the
same GGUF as the in-process backend; and the memory plan before a load."""

from __future__ import annotations

import pytest

from engine.backend import Backend, ContextOverflow, Message, Timings, complete
from engine.memory import InsufficientMemory, ModelShape, check_fits, largest_context
from engine.models import default_model_path
from engine.remote import EngineUnreachable, RemoteBackend
from rag import EngineUnavailable, Pipeline
from tests.llama_server import LlamaServer

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
    assert isinstance(remote, Backend) and remote.kind == "llama-server" and remote.n_ctx == 2048
    prompt = remote.render(MESSAGES)
    # The server applies the GGUF's own template and tokenizer: the same as in process.
    assert prompt == backend.render(MESSAGES)
    assert remote.tokenize(prompt) == backend.tokenize(prompt)


def test_remote_timings_come_from_the_server_and_a_repeated_prefix_is_cached(remote):
    tokens = remote.tokenize(remote.render(MESSAGES))
    text, first = complete(remote, tokens, max_tokens=8)
    assert text.strip() and isinstance(first, Timings)
    assert first.prompt_tokens == len(tokens) == first.cached_tokens + first.prefill_tokens
    assert first.prefill_s > 0 and 0 < first.decode_tokens <= 8 and first.decode_s > 0
    assert remote.cached_prefix(tokens) == len(tokens) - 1
    longer = remote.tokenize(remote.render([MESSAGES[0], Message("user", "What is prefill? Say it in French.")]))
    predicted = remote.cached_prefix(longer)
    _, second = complete(remote, longer, max_tokens=4)
    # The server's own cache_n: the shared prefix was not evaluated again.
    assert second.cached_tokens >= predicted > 10
    assert second.prefill_tokens == len(longer) - second.cached_tokens


def test_remote_refuses_a_prompt_over_its_context_before_sending(remote):
    with pytest.raises(ContextOverflow):
        remote.generate([1] * 2040, max_tokens=16)


def test_pipeline_over_the_remote_server_calibrates_answers_and_learns(remote, embedder, corpus, tmp_path):
    pipeline = Pipeline(tmp_path / "index", embedder=embedder, backend=remote, profile_dir=tmp_path / "profiles",
                        conversations=tmp_path / "c.sqlite")
    pipeline.ingest([corpus])
    profile = pipeline.calibrate(quick=True)
    assert profile.key["engine"] == "remote:llama-server" and profile.cost_model().predict(500) > 0
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
    from engine.settings import EngineSettings

    pipeline = Pipeline(tmp_path / "index", engine=EngineSettings(engine_url=f"http://127.0.0.1:{port}"))
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
    with pytest.raises(ValueError, match="head_count"):
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
    from engine.llama_cpp_backend import LlamaCppBackend

    with pytest.raises(InsufficientMemory, match=r"n_ctx=\d+ would fit"):
        LlamaCppBackend(n_ctx=50_000_000)  # a 1 TB KV cache: refused before llama.cpp allocates
    with pytest.raises(ValueError, match="flash attention"):
        LlamaCppBackend(kv_type="q8_0", flash_attn=False)


def test_a_q8_kv_cache_with_flash_attention_answers_in_half_the_memory(backend):
    from engine.llama_cpp_backend import LlamaCppBackend

    q8 = LlamaCppBackend(n_ctx=2048, kv_type="q8_0")
    info = q8.info()
    assert info["kv_type"] == "q8_0" and info["flash_attn"] is True
    assert info["kv_cache_bytes"] < 0.6 * backend.info()["kv_cache_bytes"]
    assert q8.profile_key()["kv_type"] == "q8_0" and "kv_type" not in backend.profile_key()
    text, timings = complete(q8, q8.tokenize(q8.render(MESSAGES)), max_tokens=8)
    assert text.strip() and timings.decode_tokens > 0
