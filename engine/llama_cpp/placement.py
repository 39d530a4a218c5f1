"""Where a new request starts in the engine's KV cache.

A request starts from the longest prefix of its prompt already held: an idle
sequence's previous prompt (``slots``), a saved snapshot of its session, or
the system prompt's cells in sequence 0, shared without a copy. Idle
sequences and snapshots count only where they are of the request's cache
scope (``engine.backend``): another scope's prompt is never a request's
start, so what a request finds cached beyond the system prompt, which every
scope shares from sequence 0, is its own scope's. A snapshot
only the disk holds is read by the snapshot cache's reader thread: while
other requests run, the request waits for it (they go on); the loop thread
only loads the bytes into the context. A passage to
keep for splicing starts right behind the system prompt. Idle sequences'
caches give way when the cache is short of cells.

Does not: decide which request goes first (``scheduler``) or run steps
(``loop``); it is called from the loop's thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from ..errors import GenerationFailed
from .snapshots import SnapshotCache
from ..tokens import common_prefix
from .native import NativeContext
from .requests import Active, Request
from .slots import SlotTable

SYSTEM_SEQ = 0
log = logging.getLogger("rag_budget.engine")


class _Deferred:
    """What :meth:`Placement.place` answers for a request whose snapshot is
    still being read from disk: it stays waiting, and the requests behind
    it may be placed meanwhile (unlike None: no room for anyone now)."""

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = _Deferred()


class Placement:
    """Gives a waiting request a sequence and the cached prefix it starts from."""

    def __init__(self, ctx: NativeContext, slots: SlotTable, snapshots: SnapshotCache, kv_cells: int) -> None:
        self.ctx, self.slots, self.snapshots, self.kv_cells = ctx, slots, snapshots, kv_cells

    def room(self, need: int, system: int, reserved: int) -> bool:
        """Whether ``need`` more cells fit beside the ``system`` prompt's cells
        and the ``reserved`` cells of running requests, after giving up idle
        caches if needed."""
        short = system + reserved + self.slots.idle_cells() + need - self.kv_cells
        if short > 0:
            for seq in self.slots.evict(short):
                self.ctx.remove(seq)
            short = system + reserved + need - self.kv_cells
        return short <= 0

    def place(self, request: Request, system: Sequence[int], reserved: int) -> Active | _Deferred | None:
        """Start ``request`` from the longest prefix held: an idle sequence's
        prompt or a saved snapshot of its cache scope, or the system prompt's
        cells (every scope's); DEFERRED
        while the snapshot it starts from is read from disk (others running
        meanwhile); None if the cache has no room for it now (or it was
        refused, and told why)."""
        tokens, ctx, cells = request.tokens, self.ctx, len(request.tokens) + request.max_tokens + 1
        if request.pin:
            ctx.remove(SYSTEM_SEQ)
            return Active(request, SYSTEM_SEQ, len(tokens), 0, 0, 0)
        if request.store is not None:
            return self._passage(request, system, reserved)
        limit = len(tokens) - 1  # the last prompt token is always evaluated, for its logits
        shared = min(common_prefix(np.asarray(system, dtype=np.int32), np.asarray(tokens, dtype=np.int32)), limit)
        scope = request.cache_scope
        idle_seq, idle = self.slots.best(tokens, scope)
        key, saved = self.snapshots.best(tokens, scope)
        idle, saved = min(idle, limit), min(saved, limit)
        restore = key is not None and saved > shared and not (idle_seq is not None and idle >= saved and idle > 0)
        if restore and reserved > 0 and not self.snapshots.read_ahead(key):
            return DEFERRED  # its snapshot is being read from disk: placed at a later step, others running meanwhile
        if idle_seq is not None and idle >= max(saved, shared) and idle > 0:
            if not self.room(cells - idle, len(system), reserved):
                return None
            seq, _ = self.slots.take(idle_seq)
            ctx.remove(seq, idle, -1)
            return Active(request, seq, cells - idle, idle, idle, idle)
        if not self.room(cells - (shared if saved <= shared else 0), len(system), reserved):
            return None
        seq, held = self.slots.take()
        try:
            if held:
                ctx.remove(seq)
            if restore:
                started = time.perf_counter()
                if self._restore(seq, key, reserved, scope):
                    ctx.remove(seq, saved, -1)  # what follows the common prefix is evaluated again
                    return Active(request, seq, cells, saved, saved, saved, saved, time.perf_counter() - started)
            if shared:
                ctx.share(SYSTEM_SEQ, seq, 0, shared)
        except BaseException:
            self.slots.release(seq, [])  # the sequence goes back whatever failed; the caller tells the request
            ctx.remove(seq)
            raise
        return Active(request, seq, cells - shared, shared, shared, shared)

    def _restore(self, seq: int, key: str, reserved: int, scope: str = "") -> bool:
        """Load snapshot ``key`` into the empty ``seq`` for a request of cache
        ``scope``; whether it is there (never, for a snapshot put under that
        key by another scope since it was found: then it is evaluated).

        llama.cpp restores a state into contiguous free cells, while room is
        counted in cells: a load can be refused for want of a run of cells
        long enough. So a refusal gives up the idle caches and tries once
        more, and the snapshot is dropped only when it is refused with
        nothing else running (then it is not a state of this model and
        context). A load that raises (a store or llama.cpp failing) leaves
        the snapshot where it is and the prompt is evaluated instead."""
        try:
            snap = self.snapshots.get(key)
            if snap is None or not self.snapshots.readable(key, snap, scope):
                return False
            if self.ctx.load(seq, snap.data):
                return True
            self.ctx.remove(seq)
            for idle in self.slots.evict(self.kv_cells):
                self.ctx.remove(idle)
            if self.ctx.load(seq, snap.data):
                return True
        except Exception as exc:  # noqa: BLE001 - a cache that fails costs a prefill, never the request
            log.warning("restoring snapshot %s failed: %r", key, exc)
            self.ctx.remove(seq)
            return False
        self.ctx.remove(seq)
        if reserved == 0:
            self.snapshots.discard(key)
        else:
            log.info("snapshot %s kept: refused while other requests hold cells", key)
        return False

    def restore_system(self) -> list[int]:
        """The system prompt loaded again into the empty sequence 0 from its
        pinned snapshot: its tokens, or [] when there is none or it does not
        load (nothing is raised: the engine goes on without a shared prefix)."""
        found = self.snapshots.pinned()
        if found is None:
            return []
        try:
            if self.ctx.load(SYSTEM_SEQ, found.data):
                return [int(t) for t in found.tokens]
        except Exception as exc:  # noqa: BLE001 - without it every prompt is evaluated whole, nothing worse
            log.warning("the system prompt could not be restored: %r", exc)
        self.ctx.remove(SYSTEM_SEQ)
        return []

    def _passage(self, request: Request, system: Sequence[int], reserved: int) -> Active | None:
        """A passage to keep is evaluated right behind the system prompt, from
        an empty sequence (never from a cache holding anything else)."""
        n = len(system)
        if not n or list(request.tokens[:n]) != list(system):
            request.fail(GenerationFailed("the system prompt changed since this passage was asked for"))
            return None
        if not self.room(len(request.tokens) - n + 1, n, reserved):
            return None
        seq, held = self.slots.take()
        if held:
            self.ctx.remove(seq)
        self.ctx.share(SYSTEM_SEQ, seq, 0, n)
        return Active(request, seq, len(request.tokens) - n + 1, n, n, n)
