"""What every engine must do, checked by behaviour, not by member names:
used on the fake, the in-process and the remote backend alike."""

from __future__ import annotations

import pytest

from engine.backend import Backend, Generation, Message, PrefixCache, Timings
from engine.errors import ContextOverflow


def check_backend(backend) -> None:
    """Exercise each member of the Backend protocol (and PrefixCache, where
    offered) and check what it promises."""
    assert isinstance(backend, Backend)
    assert isinstance(backend.name, str) and backend.name
    assert isinstance(backend.n_ctx, int) and backend.n_ctx > 0
    prompt = backend.render([Message("system", "Be brief."), Message("user", "Say hi to Ada.")])
    assert isinstance(prompt, str) and "Say hi to Ada." in prompt
    tokens = backend.tokenize(prompt)
    assert tokens and all(isinstance(t, int) for t in tokens)

    generation = backend.generate(tokens, max_tokens=4)
    assert isinstance(generation, Generation)
    pieces = list(generation)
    assert all(isinstance(p, str) for p in pieces)
    t = generation.timings
    assert isinstance(t, Timings) and t.prompt_tokens == len(tokens)
    assert t.cached_tokens + t.prefill_tokens == t.prompt_tokens
    assert 0 <= t.decode_tokens <= 4 and t.ttft_s <= t.total_s
    assert list(generation) == []  # exhausted: nothing more, timings kept
    with pytest.raises(ContextOverflow):
        backend.generate([tokens[0]] * backend.n_ctx, max_tokens=4)

    key = backend.profile_key()
    assert isinstance(key, dict) and key and key == backend.profile_key()
    assert isinstance(backend.describe(), dict)

    if isinstance(backend, PrefixCache):
        assert 0 <= backend.cached_prefix(tokens) <= len(tokens)
        filled = backend.prefill(tokens[:-1], session="contract")
        assert filled.cached_tokens + filled.prefill_tokens == len(tokens) - 1
        assert backend.cached_prefix(tokens) >= len(tokens) - 2  # what was prefilled is found again
        backend.forget("contract")
        assert isinstance(backend.cache_stats(), dict)
