"""Which sequences of the engine's context are in use, and what the idle
ones still hold.

A sequence that finished a request keeps its tokens' KV, like a slot of
llama-server: the next prompt that starts the same way (a follow-up, a
retry, a calibration chain) takes that slot and evaluates only what
differs. Idle slots are a cache: their cells are given up, least recently
used first, when a request needs room. Each idle slot remembers the cache
scope of the prompt it holds (``engine.backend``, cache scopes), and only a
prompt of that scope is told of it or started from it: another scope's
prompt finds the system prompt in sequence 0, as every prompt does.

Does not: touch llama.cpp (the loop clears the sequences this names).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..tokens import common_prefix


@dataclass
class _Slot:
    seq: int
    held: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    used: int = 0  # when it was last released (a counter, not a clock)
    scope: str = ""  # the cache scope of the prompt ``held`` is of


class SlotTable:
    """Sequences ``1..slots`` (0 is the system prompt's), busy or idle."""

    def __init__(self, slots: int) -> None:
        self._idle: dict[int, _Slot] = {s: _Slot(s) for s in range(1, slots + 1)}
        self._clock = itertools.count(1)
        self.size = slots  # sequences requests may hold, busy or idle

    @property
    def free(self) -> int:
        """Idle sequences (each may still hold a cached prompt)."""
        return len(self._idle)

    def idle_cells(self) -> int:
        """Cells the idle sequences hold."""
        return sum(len(s.held) for s in self._idle.values())

    def held(self) -> list[tuple[np.ndarray, str]]:
        """What each idle sequence holds, and the cache scope it is of."""
        return [(s.held, s.scope) for s in self._idle.values() if len(s.held)]

    def holdings(self) -> dict[int, int]:
        """Cells each idle sequence holds, by sequence."""
        return {s.seq: len(s.held) for s in self._idle.values()}

    def best(self, tokens: Sequence[int], scope: str = "") -> tuple[int | None, int]:
        """The idle sequence of cache ``scope`` whose held tokens share the
        longest prefix with ``tokens``, and that length ((None, 0) when none
        shares any).

        Does not: name another scope's sequence, however many tokens it
        shares (its system prompt's are sequence 0's to give)."""
        want = np.asarray(tokens, dtype=np.int32)
        best_seq, best_n = None, 0
        for slot in self._idle.values():
            if slot.scope != scope:
                continue
            n = common_prefix(slot.held, want)
            if n > best_n:
                best_seq, best_n = slot.seq, n
        return best_seq, best_n

    def take(self, seq: int | None = None) -> tuple[int, int]:
        """Mark a sequence busy: ``seq``, or the idle one holding least
        (the least recently used among equals). Returns it and how many
        cells it held, which the caller keeps or clears."""
        if seq is None:
            seq = min(self._idle.values(), key=lambda s: (len(s.held) > 0, s.used)).seq
        slot = self._idle.pop(seq)
        return seq, len(slot.held)

    def release(self, seq: int, held: Sequence[int], scope: str = "") -> None:
        """Mark ``seq`` idle, holding the KV of ``held`` (empty: cleared), a
        prompt of cache ``scope``."""
        self._idle[seq] = _Slot(seq, np.asarray(held, dtype=np.int32), next(self._clock), scope)

    def evict(self, cells: int) -> list[int]:
        """Give up idle sequences' cached cells, least recently used first,
        until ``cells`` are freed or none are left; the sequences to clear."""
        cleared = []
        for slot in sorted(self._idle.values(), key=lambda s: s.used):
            if cells <= 0:
                break
            if len(slot.held):
                cells -= len(slot.held)
                slot.held = np.zeros(0, dtype=np.int32)
                cleared.append(slot.seq)
        return cleared
