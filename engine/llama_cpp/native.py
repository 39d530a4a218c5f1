"""llama.cpp's C API for several sequences in one context, through
llama-cpp-python's ctypes bindings: a context with a unified KV cache, a
token batch that carries each token's sequence, position and whether its
logits are wanted, memory operations on sequences, one sequence's state
saved and loaded, and a sampler per sequence.

Every call here is on one context from one thread (the engine's loop):
llama.cpp does no locking of its own.

Does not: decide what to decode (``scheduler`` does) or keep requests
(``loop`` does).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import EngineSettingsError, GenerationFailed


@dataclass(frozen=True)
class Entry:
    """One token of a batch: its sequence, its position in that sequence,
    and whether its logits are wanted (to sample the next token)."""

    token: int
    pos: int
    seq: int
    logits: bool = False


class NativeContext:
    """A llama.cpp context over an already loaded model, with ``n_seq_max``
    sequences sharing one unified KV cache of ``n_ctx`` cells."""

    def __init__(self, model_ptr, *, n_ctx: int, n_seq_max: int, n_batch: int, n_threads: int,
                 flash_attn: bool, kv_type: int) -> None:
        import llama_cpp

        self._lc = lc = llama_cpp
        params = lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = params.n_threads_batch = n_threads
        params.type_k = params.type_v = kv_type
        params.no_perf = False
        params.kv_unified = True  # sequences share cells: a common prefix is held once
        names = {name for name, _ in params._fields_}
        if "flash_attn_type" in names:  # set, not AUTO: saved states must match it
            params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        else:
            params.flash_attn = flash_attn
        self.ctx = lc.llama_init_from_model(model_ptr, params)
        if not self.ctx:
            raise EngineSettingsError(
                f"llama.cpp could not create a context of {n_ctx} cells for {n_seq_max} sequences "
                "(a quantised KV cache needs flash attention)")
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_ctx = int(lc.llama_n_ctx(self.ctx))
        self.n_batch = int(lc.llama_n_batch(self.ctx))
        self.n_seq_max = int(lc.llama_n_seq_max(self.ctx))
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model_ptr)))
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._n_seq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        self._n_seq[:] = 1

    # -- decoding ----------------------------------------------------------------

    def decode(self, entries: Sequence[Entry]) -> int:
        """Evaluate ``entries`` (at most ``n_batch``) in one llama.cpp call.
        Returns 0, or 1 when the KV cache has no room for them (nothing was
        changed); GenerationFailed for any other failure."""
        n = len(entries)
        if not 0 < n <= self.n_batch:
            raise GenerationFailed(f"a batch of {n} tokens (the context takes 1 to {self.n_batch})")
        self._tokens[:n] = [e.token for e in entries]
        self._pos[:n] = [e.pos for e in entries]
        self._logits[:n] = [1 if e.logits else 0 for e in entries]
        seq_id = self._batch.seq_id
        for i, e in enumerate(entries):
            seq_id[i][0] = e.seq
        self._batch.n_tokens = n
        code = int(self._lc.llama_decode(self.ctx, self._batch))
        if code not in (0, 1):
            raise GenerationFailed(f"llama_decode failed with code {code}")
        return code

    def logits(self, index: int) -> np.ndarray:
        """A copy of the raw logits (float32, one per vocabulary token) of
        batch entry ``index`` of the last decode."""
        ptr = self._lc.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    # -- sequences ---------------------------------------------------------------

    def remove(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Drop the cells of ``seq`` at positions [p0, p1) (-1: open-ended)."""
        self._lc.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def share(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``src``'s cells at [p0, p1) part of ``dst`` too (no copy in a unified cache)."""
        self._lc.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move ``seq``'s cells at [p0, p1) by ``delta`` positions (RoPE is
        corrected at the next decode)."""
        self._lc.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def first_pos(self, seq: int) -> int:
        """The lowest position ``seq`` holds (-1 when empty)."""
        return int(self._lc.llama_memory_seq_pos_min(self.mem, seq))

    def last_pos(self, seq: int) -> int:
        """The highest position ``seq`` holds (-1 when empty)."""
        return int(self._lc.llama_memory_seq_pos_max(self.mem, seq))

    def clear(self) -> None:
        """Drop every cell of every sequence."""
        self._lc.llama_memory_clear(self.mem, True)

    def save(self, seq: int) -> bytearray:
        """The KV state of ``seq`` (empty if llama.cpp wrote none), written by
        llama.cpp straight into the buffer returned: one copy of tens of MB
        on the loop thread, not three."""
        lc = self._lc
        size = lc.llama_state_seq_get_size(self.ctx, seq)
        data = bytearray(size)
        if not size:
            return data
        view = (ctypes.c_uint8 * size).from_buffer(data)
        written = lc.llama_state_seq_get_data(self.ctx, view, size, seq)
        del view  # the buffer may be resized only once nothing points into it
        if written < size:
            del data[written:]  # shrinks in place
        return data

    def load(self, seq: int, data: bytes | bytearray) -> bool:
        """Replace ``seq`` with a saved state (its cells keep their saved
        positions), read where it lies (no copy); False when llama.cpp
        refuses it (another model or layout, or no room)."""
        if not data:
            return False
        if isinstance(data, bytearray):
            buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        else:  # immutable bytes: a pointer to their own buffer, which llama.cpp only reads
            buf = ctypes.cast(ctypes.c_char_p(bytes(data)), ctypes.POINTER(ctypes.c_uint8))
        return self._lc.llama_state_seq_set_data(self.ctx, buf, len(data), seq) != 0

    # -- counters and life ---------------------------------------------------------

    def close(self) -> None:
        """Free the batch and the context (before the model)."""
        if self.ctx:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self.ctx)
            self.ctx = None


class Sampler:
    """Greedy sampling with a repeat penalty over the last ``last_n``
    tokens, for one sequence (the penalty's memory is its own)."""

    def __init__(self, n_vocab: int, *, repeat_penalty: float, last_n: int = 64) -> None:
        import llama_cpp

        self._lc = lc = llama_cpp
        self.chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        penalties = lc.llama_sampler_init_penalties
        # The bindings added n_vocab in 0.3.35; both forms are in the supported range.
        args = (n_vocab, last_n, repeat_penalty, 0.0, 0.0) if len(penalties.argtypes) == 5 else \
            (last_n, repeat_penalty, 0.0, 0.0)
        lc.llama_sampler_chain_add(self.chain, penalties(*args))
        lc.llama_sampler_chain_add(self.chain, lc.llama_sampler_init_greedy())

    def sample(self, ctx: NativeContext, index: int) -> int:
        """The next token from the logits of batch entry ``index`` of the
        last decode (and remembered for the penalty)."""
        return int(self._lc.llama_sampler_sample(self.chain, ctx.ctx, index))

    def close(self) -> None:
        """Free the sampler chain."""
        if self.chain:
            self._lc.llama_sampler_free(self.chain)
            self.chain = None
