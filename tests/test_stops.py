"""Stop means stop: an answer that reaches a stop sequence costs the engine
no decode step after it, on the real model, in process and through the
pipeline; the timings up to the stop are the answer's."""

from __future__ import annotations

import pytest

from engine.backend import Generation, Message
from engine.llama_cpp.requests import Trace

pytestmark = pytest.mark.model

MESSAGES = [Message("user", "Tell me a long story about a cat who lives in a lighthouse.")]


def _text(backend, tokens) -> str:
    return backend._llm.detokenize(list(tokens), special=False).decode("utf-8", "replace")


def test_the_engine_decodes_nothing_after_a_stop_sequence(backend):
    tokens = backend.tokenize(backend.render(MESSAGES))
    free = backend.generate(tokens, max_tokens=12).result()[0]
    stop = free.split()[2]  # a word the greedy answer certainly writes, a few tokens in
    trace = Trace()  # every token sampled for the request, a step's worth each
    text, timings = backend.generate(tokens, max_tokens=64, stop=(stop,), trace=trace).result()
    # The first k tokens hold the stop: exactly those were generated, and none after.
    k = next(n for n in range(1, len(trace.tokens) + 1) if stop in _text(backend, trace.tokens[:n]))
    assert timings.decode_tokens == len(trace.tokens) == k < 64
    assert stop in text and free.startswith(text)
    assert timings.cached_tokens + timings.prefill_tokens == timings.prompt_tokens and timings.decode_s > 0


def test_the_pipeline_stops_the_engine_where_the_answer_stops(tmp_path, corpus, pipeline_factory, backend,
                                                             monkeypatch):
    import rag.qa.pipeline as pipeline_module

    # A stop the model certainly writes within its first words: the letter "e".
    monkeypatch.setattr(pipeline_module, "STOP_SEQUENCES", ("e",))
    p = pipeline_factory(tmp_path / "index")
    p.ingest([corpus])
    read: list[str] = []  # every piece the engine streamed for the answer
    traces: list[Trace] = []  # every token the engine sampled for it, a decode step each
    generate, engine_generate = p.dispatcher._generate, backend.generate

    def counted(*args, **kwargs) -> Generation:
        trace = Trace()
        traces.append(trace)
        backend.generate = lambda *a, **k: engine_generate(*a, trace=trace, **k)  # the answer's call only
        try:
            inner = generate(*args, **kwargs)
        finally:
            del backend.generate

        def run():
            with inner:
                for piece in inner:
                    read.append(piece)
                    yield piece
            return inner.timings

        return Generation(run(), engine="counted")

    p.dispatcher._generate = counted
    # The model's own text (the quoted evidence an answer opens with by default holds an "e" of its own).
    answer = p.ask("What limits decode speed?", max_tokens=64, no_target=True, evidence="last")
    assert "e" not in answer.answer  # cut at the stop
    # The engine's last piece completed the stop: nothing was decoded after it.
    assert "e" in read[-1] and "e" not in "".join(read[:-1])
    # Counted in tokens, not pieces (a character of several bytes may take two tokens and one piece):
    # the first k sampled tokens hold the stop, and exactly those were decoded.
    [trace] = traces
    k = next(n for n in range(1, len(trace.tokens) + 1) if "e" in _text(backend, trace.tokens[:n]))
    assert answer.timings.decode_tokens == len(trace.tokens) == k < 64
