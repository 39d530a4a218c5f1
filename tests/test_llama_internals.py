"""The one module that touches llama-cpp-python's private parts, pinned to
the releases it was read against, and exercised on a real model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.llama_cpp.internals import SUPPORTED, is_supported, model_pointer, token_text, version_tuple, vocab_pointer

ROOT = Path(__file__).resolve().parent.parent


def test_versions_compare_by_number():
    assert version_tuple("0.3.36") == (0, 3, 36) and version_tuple("0.3.4rc1") == (0, 3, 4)
    assert is_supported("0.3.30") and is_supported("0.3.99") and not is_supported("0.3.29")
    assert not is_supported("0.4.0")


def test_pyproject_pins_the_range_the_internals_were_read_against():
    pin = re.search(r'"llama-cpp-python>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml must pin llama-cpp-python to a range"
    low, high = version_tuple(pin.group(1)), version_tuple(pin.group(2))
    assert low == SUPPORTED[0] and high + (0,) * (3 - len(high)) == SUPPORTED[1]


@pytest.mark.model
def test_the_installed_release_works_with_every_private_part_used():
    import llama_cpp

    from engine.llama_cpp.native import Entry, NativeContext
    from engine.models import default_model_path

    assert is_supported(llama_cpp.__version__), llama_cpp.__version__
    from engine.llama_cpp.internals import load_llama
    from engine.llama_cpp.selfcheck import engine_verdict

    path = default_model_path()
    llm = load_llama(path, extra_bufts=engine_verdict(path).extra_bufts, n_ctx=64, n_batch=1)
    eos = llm.token_eos()
    assert token_text(llm, eos) and llama_cpp.llama_vocab_is_eog(vocab_pointer(llm), eos)
    ctx = NativeContext(model_pointer(llm), n_ctx=256, n_seq_max=2, n_batch=64, n_threads=1, flash_attn=True,
                        kv_type=llama_cpp.GGML_TYPE_F16)  # a context of our own on the model Llama loaded
    tokens = llm.tokenize(b"The quick brown fox", add_bos=False)
    assert ctx.decode([Entry(t, i, 1, i == len(tokens) - 1) for i, t in enumerate(tokens)]) == 0
    assert ctx.last_pos(1) == len(tokens) - 1
    ctx.close()
    llm.close()
