"""Every use of llama-cpp-python's private parts, in one place.

The engine makes its own llama.cpp context on the model that a ``Llama``
object loaded, so it needs the model's and the vocabulary's raw pointers,
which ``Llama`` does not offer publicly, and the text of special tokens for
the chat template. They are read here only, against the releases in
:data:`SUPPORTED` (``tests/test_llama_internals.py`` pins it), so an upgrade
that moves them breaks one small module, loudly. Everything else goes
through llama-cpp-python's public C bindings (``native``).

Does not: evaluate anything.
"""

from __future__ import annotations

import contextlib
import re
import threading

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


_params_lock = threading.RLock()


@contextlib.contextmanager
def extra_buffer_types(on: bool):
    """Inside this block, every ``llama_cpp.Llama`` made in this process
    (this one's, or a library's such as LangChain's ``ChatLlamaCpp``) loads
    its model with llama.cpp's extra buffer types (weight repacking, AMX)
    only if ``on``. ``Llama`` offers no such option: it fills its model
    parameters from ``llama_model_default_params``, which is wrapped here
    for the block's length (one block at a time)."""
    if on:
        yield
        return
    import llama_cpp.llama_cpp as bindings

    with _params_lock:
        original = bindings.llama_model_default_params

        def without_extra_bufts():
            params = original()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = without_extra_bufts
        try:
            yield
        finally:
            bindings.llama_model_default_params = original


def load_llama(model_path, *, extra_bufts: bool = True, **options):
    """A ``llama_cpp.Llama`` on ``model_path`` (``options`` as ``Llama`` takes
    them, ``verbose`` off), without extra buffer types unless ``extra_bufts``."""
    import llama_cpp

    with extra_buffer_types(extra_bufts):
        return llama_cpp.Llama(model_path=str(model_path), verbose=False, **options)


def model_pointer(llm):
    """The ``llama_model *`` a ``llama_cpp.Llama`` loaded (shared, not copied)."""
    return llm._model.model


def vocab_pointer(llm):
    """The ``llama_vocab *`` of a ``llama_cpp.Llama``'s model."""
    return llm._model.vocab


def token_text(llm, token: int) -> str:
    """The text of a special token (BOS, EOS) as a chat template writes it."""
    return "" if token == -1 else llm._model.token_get_text(token)


# Gemma 3's chat template (Google's, less its image and tool parts): the
# packaged gemma3-270m GGUF (converted from the base google/gemma-3-270m)
# carries none. Gemma has no system role: the system text opens the first
# user turn, so it is still the prompt's stable prefix.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "<start_of_turn>{{ role }}\n{{ ((first_user_prefix if loop.first else '') + message['content']) | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
FALLBACK_TEMPLATES = {"gemma3": GEMMA3_TEMPLATE}  # by general.architecture, for GGUFs without a template


def chat_formatter(llm, model_path):
    """llama-cpp-python's Jinja2 formatter for the model's own chat template
    (for a model without one, its architecture's from
    :data:`FALLBACK_TEMPLATES`); ModelFileError if there is none."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from ..errors import ModelFileError

    template = llm.metadata.get("tokenizer.chat_template") or FALLBACK_TEMPLATES.get(
        llm.metadata.get("general.architecture", ""))
    if not template:
        raise ModelFileError(f"{model_path}: the model has no chat template in its metadata")
    return Jinja2ChatFormatter(template=template, eos_token=token_text(llm, llm.token_eos()),
                               bos_token=token_text(llm, llm.token_bos()))
