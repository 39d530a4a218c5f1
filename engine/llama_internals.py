"""Every use of llama-cpp-python's private parts, in one place.

The in-process backend needs a few things the ``Llama`` class does not offer
publicly: which tokens its KV cache holds, how to cut that cache back, how
to save and load one sequence's KV state, and llama.cpp's own performance
counters. They are read and written here only, against the releases in
:data:`SUPPORTED` (``tests/test_llama_internals.py`` pins it), so an
upgrade that moves them breaks one small module, loudly.

Does not: decide when to save, restore or evaluate (the backend does).
"""

from __future__ import annotations

import ctypes
import re
from typing import Sequence

import numpy as np

# The llama-cpp-python releases this module was read against (pyproject pins the same).
SUPPORTED = ((0, 3, 30), (0, 4, 0))  # from, up to but not including


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.3.36" -> (0, 3, 36)``; trailing non-numeric parts are dropped."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):  # "4rc1": a pre-release of 4
            break
    return tuple(parts)


def is_supported(version: str) -> bool:
    """Whether ``version`` of llama-cpp-python is one this module was read against."""
    low, high = SUPPORTED
    return low <= version_tuple(version) < high


class LiveState:
    """The live KV cache of one ``llama_cpp.Llama`` (sequence 0), its token
    history, and its performance counters."""

    def __init__(self, llm) -> None:
        import llama_cpp

        self._lc = llama_cpp
        self._llm = llm

    # -- the model's vocabulary ------------------------------------------

    def token_text(self, token: int) -> str:
        """The text of a special token (BOS, EOS) as the chat template writes it."""
        return "" if token == -1 else self._llm._model.token_get_text(token)

    def is_end_of_generation(self, token: int) -> bool:
        """Whether ``token`` ends a generation (EOS, end of turn)."""
        return bool(self._lc.llama_vocab_is_eog(self._llm._model.vocab, token))

    # -- what the KV cache holds -------------------------------------------

    def held(self) -> np.ndarray:
        """The tokens whose KV the live cache holds, in order (int32)."""
        llm = self._llm
        return np.asarray(llm.input_ids[: llm.n_tokens], dtype=np.int32)

    def has_logits_for(self, n_prompt: int) -> bool:
        """Whether the cache holds exactly ``n_prompt`` tokens with the
        logits of the last one still live (so sampling can start at once)."""
        return self._llm.n_tokens == n_prompt and not getattr(self._llm, "_requires_eval", True)

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` held tokens; the next eval continues after them."""
        self._llm.n_tokens = n

    # -- one sequence's state ----------------------------------------------

    def save(self) -> tuple[np.ndarray, bytes] | None:
        """The held tokens and the KV state bytes of sequence 0, or None if
        nothing is held or llama.cpp wrote nothing."""
        lc, llm = self._lc, self._llm
        if llm.n_tokens == 0:
            return None
        size = lc.llama_state_seq_get_size(llm.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(llm.ctx, buf, size, 0)
        if not written:
            return None
        return self.held().copy(), bytes(buf)[:written]

    def load(self, tokens: Sequence[int], data: bytes) -> bool:
        """Replace the live cache with a saved state of sequence 0 holding
        ``tokens``; False (and an empty cache) if llama.cpp refuses it as
        not a state of this model and context."""
        lc, llm = self._lc, self._llm
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if lc.llama_state_seq_set_data(llm.ctx, buf, len(data), 0) == 0:
            llm.n_tokens = 0
            return False
        n = len(tokens)
        llm.input_ids[:n] = tokens
        llm.n_tokens = n
        llm._requires_eval = True  # no logits came with the KV: sample only after a decode
        return True

    # -- llama.cpp's counters ----------------------------------------------

    def reset_counters(self) -> None:
        """Zero llama.cpp's prompt-eval and eval counters (llama-cpp-python
        resets them only when verbose)."""
        self._lc.llama_perf_context_reset(self._llm.ctx)

    def evaluated(self) -> tuple[int, float]:
        """Tokens llama.cpp evaluated since the last reset, and the seconds it took.

        llama.cpp reports each count as at least 1 even when nothing ran, so a
        count whose time is zero is read as zero. A one-token batch is counted
        as "eval", not "prompt eval"; both are summed.
        """
        # Decoding is asynchronous: the counters are only complete once it is done.
        self._lc.llama_synchronize(self._llm.ctx)
        perf = self._lc.llama_perf_context(self._llm.ctx)
        n_p = perf.n_p_eval if perf.t_p_eval_ms > 0 else 0
        n_e = perf.n_eval if perf.t_eval_ms > 0 else 0
        return n_p + n_e, (perf.t_p_eval_ms + perf.t_eval_ms) / 1000.0
