"""The llama.cpp backend on the real bundled GGUF: streaming and measured timings."""

from __future__ import annotations

import threading
import time

import pytest

from engine import ContextOverflow, FakeBackend, GenerationCancelled, Message, Timings
from engine.backend import Cancel

from .backend_contract import check_backend

SYSTEM = Message("system", "You are a terse assistant. Answer in one short sentence.")


def _run(backend, prompt, max_tokens=8):
    generation = backend.generate(prompt, max_tokens=max_tokens)
    pieces = list(generation)
    assert all(isinstance(p, str) for p in pieces)
    assert isinstance(generation.timings, Timings)
    return "".join(pieces), generation.timings


def test_backends_keep_the_protocol(backend):
    check_backend(backend)
    fake = FakeBackend()
    check_backend(fake)
    fake.close()


def test_a_generation_closed_early_frees_the_engine(backend):
    prompt = backend.render([SYSTEM, Message("user", "Count from one to fifty.")])
    with backend.generate(prompt, max_tokens=64) as generation:
        first = next(generation)
    assert first and not generation.done
    _, t = backend.generate(prompt, max_tokens=2).result()  # the engine is free again
    assert t.decode_tokens <= 2


def test_a_cancel_stops_each_part_once_whether_handed_over_before_or_after_it_was_asked():
    cancel, stopped = Cancel(), []
    cancel.on_cancel(lambda: stopped.append("before"))
    assert stopped == []
    cancel()
    cancel()  # asking twice is asking once
    cancel.on_cancel(lambda: stopped.append("after"))  # a part that starts after the stop is stopped at once
    assert stopped == ["before", "after"]


def test_a_generation_cancelled_from_another_thread_ends_its_reader(backend):
    """A reader still waiting for the first piece (as the service's thread
    is for a client that went away) ends with GenerationCancelled when
    another thread cancels the generation, and the engine lets it go."""
    question = "Cancelled. " + " ".join(f"Point {n}." for n in range(250))  # two steps of prompt or more
    generation = backend.generate(backend.render([SYSTEM, Message("user", question)]), max_tokens=64)
    ended: list[BaseException | None] = []

    def read() -> None:
        try:
            generation.result()
            ended.append(None)
        except BaseException as exc:  # noqa: BLE001 - what ended it is the assertion
            ended.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    loop = backend.loop
    deadline = time.monotonic() + 300  # hang guards, not timing checks
    while not loop.published.active and time.monotonic() < deadline:
        time.sleep(0.01)
    generation.cancel()  # from this thread, without waiting
    reader.join(300)
    assert not reader.is_alive() and len(ended) == 1 and isinstance(ended[0], GenerationCancelled), ended
    while (loop.published.active or loop.published.waiting) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not loop.published.active and not loop.published.waiting
    _, t = backend.generate(backend.render([SYSTEM, Message("user", "Hi")]), max_tokens=2).result()
    assert t.decode_tokens <= 2


def test_prompt_uses_the_models_own_chat_template(backend):
    prompt = backend.render([SYSTEM, Message("user", "Hi")])
    assert prompt.startswith("<|im_start|>system\nYou are a terse assistant.")
    assert prompt.endswith("<|im_start|>assistant\n")


def test_timings_come_from_the_engine_and_add_up(backend):
    prompt = backend.render([SYSTEM, Message("user", "Name one colour of the sky.")])
    text, t = _run(backend, prompt, max_tokens=6)
    assert text.strip()
    assert t.prompt_tokens == len(backend.tokenize(prompt))
    assert t.cached_tokens + t.prefill_tokens == t.prompt_tokens
    assert 0 < t.decode_tokens <= 6
    assert 0 < t.prefill_s <= t.ttft_s <= t.total_s
    assert t.decode_s >= 0


def test_a_shared_prefix_is_reused_and_reported_as_cached(backend):
    first = backend.render([SYSTEM, Message("user", "What is two plus two?")])
    second = backend.render([SYSTEM, Message("user", "What colour is grass?")])
    _run(backend, first)
    tokens = backend.tokenize(second)
    predicted = backend.cached_prefix(tokens)
    _, t = _run(backend, second)
    system_tokens = len(backend.tokenize(backend.render([SYSTEM])))
    assert t.cached_tokens == predicted
    assert t.cached_tokens >= system_tokens - 2
    assert t.prefill_tokens == t.prompt_tokens - t.cached_tokens < t.prompt_tokens
    # The same prompt again: all but the token replayed for fresh logits is cached.
    _, again = _run(backend, second)
    assert again.prefill_tokens <= 1 and again.cached_tokens >= again.prompt_tokens - 1


def test_prompt_over_the_context_is_refused_before_any_work(backend):
    long_prompt = backend.render([Message("user", "word " * (backend.n_ctx + 10))])
    with pytest.raises(ContextOverflow, match="context window"):
        backend.generate(long_prompt, max_tokens=4)


def test_info_reports_build_device_model_and_threads(backend):
    info = backend.describe()
    assert info["build"] in {"CPU", "CUDA", "Metal", "Vulkan", "ROCm", "SYCL", "GPU"}
    assert info["model_bytes"] > 10_000_000 and info["model_path"].endswith(".gguf")
    assert info["n_ctx"] == backend.n_ctx and info["n_threads"] >= 1
    assert (info["n_gpu_layers"] == -1) == info["gpu_offload_supported"]
