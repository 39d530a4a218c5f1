"""Every use of llama-cpp-python's private parts, in one place.

The engine makes its own llama.cpp context on the model that a ``Llama``
object loaded, so it needs the model's and the vocabulary's raw pointers,
which ``Llama`` does not offer publicly, and the text of special tokens for
the chat template. They are read here only, against the releases in
:data:`SUPPORTED` (``tests/test_llama_internals.py`` pins it), so an upgrade
that moves them breaks one small module, loudly. Everything else goes
through llama-cpp-python's public C bindings (``llama_native``).

Does not: evaluate anything.
"""

from __future__ import annotations

import re

# The llama-cpp-python releases this module was read against (pyproject pins the same).
SUPPORTED = ((0, 3, 30), (0, 4, 0))  # from, up to but not including


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.3.36" -> (0, 3, 36)``; a pre-release part ends it (``"0.3.4rc1" -> (0, 3, 4)``)."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break
    return tuple(parts)


def is_supported(version: str) -> bool:
    """Whether ``version`` of llama-cpp-python is one this module was read against."""
    low, high = SUPPORTED
    return low <= version_tuple(version) < high


def model_pointer(llm):
    """The ``llama_model *`` a ``llama_cpp.Llama`` loaded (shared, not copied)."""
    return llm._model.model


def vocab_pointer(llm):
    """The ``llama_vocab *`` of a ``llama_cpp.Llama``'s model."""
    return llm._model.vocab


def token_text(llm, token: int) -> str:
    """The text of a special token (BOS, EOS) as a chat template writes it."""
    return "" if token == -1 else llm._model.token_get_text(token)


def chat_formatter(llm, model_path):
    """llama-cpp-python's Jinja2 formatter for the model's own chat template;
    ModelFileError if the model has none."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from .errors import ModelFileError

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise ModelFileError(f"{model_path}: the model has no chat template in its metadata")
    return Jinja2ChatFormatter(template=template, eos_token=token_text(llm, llm.token_eos()),
                               bos_token=token_text(llm, llm.token_bos()))
