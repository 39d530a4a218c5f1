"""The one module that touches llama-cpp-python's private parts, pinned to
the releases it was read against, and exercised on a real model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.llama_internals import SUPPORTED, LiveState, is_supported, version_tuple

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

    from engine.models import default_model_path

    assert is_supported(llama_cpp.__version__), llama_cpp.__version__
    llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=256, n_batch=64, verbose=False, no_perf=False)
    live = LiveState(llm)
    assert live.token_text(llm.token_eos()) and live.is_end_of_generation(llm.token_eos())
    tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog.", add_bos=False)
    live.reset_counters()
    llm.eval(tokens)
    assert list(live.held()) == tokens and live.has_logits_for(len(tokens))
    assert live.evaluated()[0] == len(tokens)
    saved = live.save()
    assert saved is not None and list(saved[0]) == tokens and len(saved[1]) > 0
    live.truncate(0)
    assert len(live.held()) == 0
    assert live.load(*saved) and list(live.held()) == tokens and not live.has_logits_for(len(tokens))
    assert not live.load(saved[0], b"not a state")  # refused, and the cache left empty
    assert len(live.held()) == 0
    llm.close()
