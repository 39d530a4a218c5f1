"""Engine errors reach the user as rag-budget's own, mapped in one place."""

from __future__ import annotations

import pytest

from engine.errors import (
    ContextOverflow,
    EngineSettingsError,
    EngineUnreachable,
    GenerationFailed,
    InsufficientMemory,
    ModelFileError,
)
from rag.errors import (
    EngineMisconfigured,
    EngineUnavailable,
    ModelNotFound,
    QuestionTooLong,
    RagError,
    from_engine,
)


@pytest.mark.parametrize("error, kind", [
    (ModelFileError("m.gguf: no such model file"), ModelNotFound),
    (EngineSettingsError("a q8_0 KV cache needs flash attention"), EngineMisconfigured),
    (ContextOverflow("prompt of 9 tokens + 9 answer tokens exceeds the context window of 8"), QuestionTooLong),
    (InsufficientMemory("a context of 10 tokens needs ..."), EngineUnavailable),
    (EngineUnreachable("http://x: the stream broke off"), EngineUnavailable),
    (GenerationFailed("the KV cache is full"), EngineUnavailable),
])
def test_each_engine_error_has_its_user_error(error, kind):
    mapped = from_engine(error)
    assert type(mapped) is kind and isinstance(mapped, RagError)
    assert str(error) in str(mapped)


def test_engine_settings_are_not_reported_as_a_missing_model():
    mapped = from_engine(EngineSettingsError("a q8_0 KV cache needs flash attention; drop --no-flash-attn"))
    assert "model" not in str(mapped).lower().split("flash")[0] and "flash attention" in str(mapped)
