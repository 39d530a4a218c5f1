"""Fault injection for the in-process engine: wrappers around the native
context and the KV stores that fail chosen calls, at seeded random calls or
on demand, so that what the engine does when llama.cpp or a cache fails can
be tested and soaked on the real model (``tests``, ``rag bench faults``).

A fault is what the wrapped call can really do: ``decode`` raises
GenerationFailed (llama_decode returned an error); ``save`` raises;
``load`` is refused (llama.cpp returns 0, as for a state that does not fit)
or raises; a store's ``get`` and ``put`` raise OSError (a disk going away).

Does not: decide what the engine does about a fault (``loop``,
``placement`` and ``splicing`` do), or run anything by itself.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Mapping

from ..errors import GenerationFailed
from .snapshots import Snapshot

OPS = ("decode", "save", "load", "snapshot_get", "snapshot_put", "passage_get", "passage_put")


class InvariantBroken(AssertionError):
    """What the engine promises under faults did not hold (a leak, a hang, a lost system prompt)."""


class InjectedFault(OSError):
    """A failure made on purpose by :class:`Faults`."""


class Faults:
    """Which calls fail: each op of :data:`OPS` at random with its rate in
    ``rates`` (seeded, so a run can be repeated), and the next ``n`` calls of
    an op asked for by :meth:`fail_next`. Counts calls and faults per op.
    Off while ``active`` is false. Thread safe."""

    def __init__(self, seed: int = 0, rates: Mapping[str, float] | None = None) -> None:
        unknown = set(rates or {}) - set(OPS)
        if unknown:
            raise ValueError(f"unknown fault ops {sorted(unknown)}; expected some of {OPS}")
        self.rates = dict(rates or {})
        self.active = True
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._next: Counter[str] = Counter()
        self._how: dict[str, str] = {}
        self._lock = threading.Lock()

    def fail_next(self, op: str, times: int = 1, how: str = "raise") -> None:
        """Fail the next ``times`` calls of ``op``; ``how`` "refuse" makes a
        ``load`` return False instead of raising."""
        if op not in OPS:
            raise ValueError(f"unknown fault op {op!r}")
        with self._lock:
            self._next[op] += times
            self._how[op] = how

    def strike(self, op: str) -> str | None:
        """Whether this call of ``op`` fails, and how ("raise" or "refuse")."""
        with self._lock:
            self.calls[op] += 1
            if self._next[op] > 0:
                self._next[op] -= 1
                self.injected[op] += 1
                return self._how.get(op, "raise")
            if self.active and self._rng.random() < self.rates.get(op, 0.0):
                self.injected[op] += 1
                return "refuse" if op == "load" and self._rng.random() < 0.5 else "raise"
        return None


class FaultyContext:
    """A :class:`~engine.llama_cpp.native.NativeContext` whose ``decode``,
    ``save`` and ``load`` fail when ``faults`` says so; everything else is
    the context's own."""

    def __init__(self, ctx, faults: Faults) -> None:
        self._ctx, self.faults = ctx, faults

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def decode(self, entries) -> int:
        """As the context's, or GenerationFailed before anything is evaluated."""
        if self.faults.strike("decode"):
            raise GenerationFailed("llama_decode failed with code -3 (injected)")
        return self._ctx.decode(entries)

    def save(self, seq: int) -> bytes:
        """As the context's, or InjectedFault."""
        if self.faults.strike("save"):
            raise InjectedFault("saving a sequence failed (injected)")
        return self._ctx.save(seq)

    def load(self, seq: int, data: bytes) -> bool:
        """As the context's, or refused (False) or InjectedFault; nothing is loaded then."""
        how = self.faults.strike("load")
        if how == "refuse":
            return False
        if how:
            raise InjectedFault("loading a state failed (injected)")
        return self._ctx.load(seq, data)


class FaultyCache:
    """A :class:`~engine.llama_cpp.snapshots.SnapshotCache` whose ``get`` and ``put``
    raise when ``faults`` says so (ops ``<kind>_get`` and ``<kind>_put``)."""

    def __init__(self, cache, faults: Faults, kind: str) -> None:
        self._cache, self.faults, self._kind = cache, faults, kind

    def __getattr__(self, name: str):
        return getattr(self._cache, name)

    def get(self, key: str) -> Snapshot | None:
        """As the cache's, or InjectedFault."""
        if self.faults.strike(f"{self._kind}_get"):
            raise InjectedFault(f"reading {key} failed (injected)")
        return self._cache.get(key)

    def put(self, key: str, snapshot: Snapshot, *, pin: bool = False) -> None:
        """As the cache's, or InjectedFault (nothing is kept)."""
        if self.faults.strike(f"{self._kind}_put"):
            raise InjectedFault(f"writing {key} failed (injected)")
        self._cache.put(key, snapshot, pin=pin)


def inject(backend, faults: Faults) -> Faults:
    """Make ``backend`` (a :class:`~engine.llama_cpp.backend.LlamaCppBackend`
    with nothing in flight) fail as ``faults`` says, from its next request."""
    loop = backend.loop
    ctx = FaultyContext(loop.ctx, faults)
    loop.ctx = loop.placement.ctx = loop.splicer.ctx = ctx
    snapshots = FaultyCache(loop.snapshots, faults, "snapshot")
    loop.snapshots = loop.placement.snapshots = backend.snapshots = snapshots
    backend.passages.cache = FaultyCache(backend.passages.cache, faults, "passage")
    return faults


def settle(loop, wait_s: float = 60.0) -> None:
    """Wait until ``loop`` holds and waits for nothing, then check that every
    sequence is free and the KV cache holds exactly what the loop says:
    the system prompt in sequence 0, each idle sequence its cached prompt,
    the splicing scratch nothing (cells conserved). InvariantBroken if it
    never settles within ``wait_s`` (a hang guard) or a cell is astray.
    Reads the context only while the loop waits (llama.cpp has no locks)."""
    from .placement import SYSTEM_SEQ

    deadline = time.monotonic() + wait_s
    while True:
        p = loop.published
        if (p.free == loop.slots.size and not p.active and not p.waiting and not p.warming
                and not loop.splicer.warm_size() and not loop._inbox and not loop.system_prompt.quick_tries):
            break
        if time.monotonic() > deadline:
            raise InvariantBroken(f"the engine never settled: {p.free} of {loop.slots.size} sequences free, "
                                  f"{len(p.active)} running, {len(p.waiting)} waiting")
        time.sleep(0.05)
    time.sleep(0.05)  # the loop publishes before it goes back to wait
    ctx = loop.ctx
    if ctx.last_pos(SYSTEM_SEQ) != len(loop.system) - 1:
        raise InvariantBroken("sequence 0 does not hold the system prompt the loop names")
    for seq, cells in loop.slots.holdings().items():
        if ctx.first_pos(seq) != (0 if cells else -1) or ctx.last_pos(seq) != cells - 1:
            raise InvariantBroken(f"sequence {seq} holds other cells than its cached prompt's {cells}")
    if ctx.last_pos(loop.splicer.scratch) != -1:
        raise InvariantBroken("the splicing scratch sequence was left holding cells")


def thread_cpu_ticks(thread: threading.Thread) -> int | None:
    """CPU time ``thread`` has used so far, in clock ticks (None where /proc does not say)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError, TypeError):
        return None


def idle_cpu_ticks(loop, seconds: float = 0.5) -> int | None:
    """CPU ticks the loop's thread used over ``seconds`` while nothing is asked of it (0 or 1: it waits)."""
    before = thread_cpu_ticks(loop._thread)
    time.sleep(seconds)
    after = thread_cpu_ticks(loop._thread)
    return None if before is None or after is None else after - before

