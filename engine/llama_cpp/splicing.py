"""Stored passages in and out of the engine's context: a passage evaluated
behind the system prompt is saved to the store; a stored passage inside a
new prompt is loaded into a scratch sequence, moved to its position there
(llama.cpp corrects RoPE for the shift) and shared into the request's
sequence, after its first ``fresh`` tokens were evaluated.

llama.cpp takes a sequence's new tokens only right after the last position
it holds, so a prompt is evaluated up to each stored passage's splice point,
the passage's cells go in, and evaluation goes on after them.

A stored passage only the disk holds is read by the snapshot cache's
reader thread: a prompt that reaches its splice point before it landed
stops there while the other requests run (``capped`` leaves it out), and
the loop waits for the read only when nothing else would run.

Everything here runs on the engine's loop thread, except :meth:`wanted`
and :meth:`warm_size` (the queue of passages to warm has its own lock).

Does not: schedule (``scheduler``), own requests (``loop``), or
decide what is kept (``passage_kv``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Sequence

from .native import NativeContext
from .passage_kv import PassageStore, Splice, segments
from .requests import Active, Request
from ..scheduler import Step

log = logging.getLogger("rag_budget.engine")
WARM_QUEUE = 256  # passages waiting to be warmed; the oldest wishes go first when it is full


class Splicer:
    """Splices stored passages into requests on ``ctx`` through sequence
    ``scratch``, saves evaluated passages, and queues passages to warm."""

    def __init__(self, ctx: NativeContext, store: PassageStore | None, scratch: int) -> None:
        self.ctx, self.store, self.scratch = ctx, store, scratch
        self._warm: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        # Set by the loop: gives up idle sequences' caches, and says whether no other request holds cells.
        self.make_room: Callable[[], bool] = lambda: True
        # Request key -> (the request, its canonical length) stopped at a passage still being read from disk.
        self._reading: dict[int, tuple[Active, int]] = {}

    @property
    def enabled(self) -> bool:
        """Whether prompts are spliced from a store."""
        return self.store is not None and self.store.enabled

    # -- requests ------------------------------------------------------------------

    def plan(self, a: Active, system: Sequence[int]) -> None:
        """Note the stored passages of ``a``'s prompt (those of its request's
        collection, and exact segments of its cache scope) that lie after
        what it found cached, and place any that starts right there."""
        if self.enabled and a.req.spans:
            a.splices = self.store.splices(system, a.req.tokens, a.req.spans, a.next, collection=a.req.collection,
                                           scope=a.req.cache_scope)
            for splice in a.splices:  # those only the disk holds are read now, off this thread
                self.store.cache.read_ahead(splice.key)
            self.catch_up(a, len(system))

    def stored(self, request: Request, system: Sequence[int]) -> tuple[int, int]:
        """Prompt tokens of ``request`` that its stored passages would supply now, and how many passages."""
        if not self.enabled or not request.spans:
            return 0, 0
        found = self.store.splices(system, request.tokens, request.spans, len(system), collection=request.collection,
                                   scope=request.cache_scope)
        return sum(sp.spliced for sp in found), len(found)

    def capped(self, step: Step, active: dict[int, Active], busy_step_tokens: int) -> Step:
        """``step`` with each prompt's tokens stopped at its next splice point,
        and warming held to ``busy_step_tokens`` (so it gives way within a step).
        The passages whose reads from disk have landed are placed first; a
        prompt whose passage is still being read stays out, unless nothing
        else would run: then the loop waits for that read (only that
        request is waiting anyway), so no request turns in place for ever."""
        self._land(active, wait=False)
        found = self._cap(step, active, busy_step_tokens)
        if not found.tokens and self._reading:
            self._land(active, wait=True)
            found = self._cap(step, active, busy_step_tokens)
        return found

    def _land(self, active: dict[int, Active], *, wait: bool) -> None:
        """Place the passages of the requests stopped at one being read,
        those whose reads have landed (with ``wait``, the first one's read
        is waited for); forget those no longer running."""
        for key, (a, canonical) in list(self._reading.items()):
            if active.get(key) is not a:
                del self._reading[key]  # finished or cancelled meanwhile
                continue
            self.catch_up(a, canonical, wait=wait)
            wait = False

    @staticmethod
    def _cap(step: Step, active: dict[int, Active], busy_step_tokens: int) -> Step:
        prefill = []
        for key, n in step.prefill:
            a = active[key]
            until = a.until_splice()
            n = min(n, until) if until is not None else n
            n = min(n, busy_step_tokens) if a.req.idle else n
            if n > 0:
                prefill.append((key, n))
        return Step(step.decode, tuple(prefill))

    def catch_up(self, a: Active, canonical: int, *, wait: bool = False) -> None:
        """Place every stored passage whose splice point ``a`` has reached;
        one that cannot be placed (gone, refused) is evaluated as usual. One
        still being read from disk stops ``a`` there until a later step
        (``capped`` places it once it landed), unless ``wait``: then this
        waits for the read."""
        while a.splices and a.next >= a.splices[0].point:
            splice = a.splices[0]
            if a.next == splice.point and not wait and not self.store.cache.read_ahead(splice.key):
                self._reading[a.req.key] = (a, canonical)  # the loop must not wait for the disk here
                return
            a.splices.pop(0)
            if a.next == splice.point:
                self._place(a, splice, canonical)
        self._reading.pop(a.req.key, None)

    def _place(self, a: Active, splice: Splice, canonical: int) -> None:
        started = time.perf_counter()
        ctx, n = self.ctx, splice.end - splice.start
        placed, refused = False, False
        try:
            data = self.store.get(splice.key)
            if data is not None:
                loaded = ctx.load(self.scratch, data)
                if not loaded:  # llama.cpp wants a run of free cells: give up idle caches, try once more
                    ctx.remove(self.scratch)
                    alone = self.make_room()
                    loaded = ctx.load(self.scratch, data)
                    refused = not loaded and alone  # refused with room: not a state of this set-up
                origin = canonical if splice.origin is None else splice.origin
                # A state of another length or place is not this passage: never use it.
                if loaded and ctx.first_pos(self.scratch) == origin and \
                        ctx.last_pos(self.scratch) == origin + n - 1:
                    if splice.start != origin:
                        ctx.shift(self.scratch, origin, origin + n, splice.start - origin)
                    ctx.share(self.scratch, a.seq, splice.point, splice.end)
                    placed = True
                refused = refused or (loaded and not placed)
        except Exception as exc:  # noqa: BLE001 - a store that fails costs a prefill, never the request
            log.warning("splicing passage %s failed: %r", splice.key, exc)
        finally:
            ctx.remove(self.scratch)
        if refused:
            self.store.discard(splice.key)
        if placed:
            a.next = a.n_past = splice.end
            a.spliced += splice.spliced
            a.spliced_passages += 1
            a.splice_s += time.perf_counter() - started

    def keep(self, a: Active, system: Sequence[int]) -> None:
        """Save the passage ``a`` evaluated behind the system prompt (its
        sequence then holds nothing)."""
        canonical = len(system)
        self.ctx.remove(a.seq, 0, canonical)  # the system prompt's cells stay sequence 0's
        data = self.ctx.save(a.seq)
        if data and self.store is not None and a.req.store is not None:
            self.store.put(a.req.store, a.req.tokens[canonical:], data)
        self.ctx.remove(a.seq)

    def keep_segments(self, a: Active, system: Sequence[int]) -> int:
        """Keep the exact segments of ``a``'s answered prompt that the store
        does not hold yet (its sequence still holds them), under its
        request's collection and cache scope; how many were kept.
        Runs before its sequence is given back; a segment that cannot be
        saved is only a cache entry lost."""
        store = self.store
        if store is None or not store.exact or not a.req.spans:
            return 0
        prompt = a.req.tokens
        bounds = [(s, e) for s, e in segments(prompt, a.req.spans, len(system)) if e <= a.n_past]
        kept = 0
        keys = store.segment_keys(prompt, bounds, collection=a.req.collection, scope=a.req.cache_scope)
        for (start, end), key in zip(bounds, keys):
            if store.holds(key):
                continue
            try:
                self.ctx.share(a.seq, self.scratch, start, end)
                data = self.ctx.save(self.scratch)
            finally:
                self.ctx.remove(self.scratch)
            if data:
                store.put(key, prompt[start:end], data)
                kept += 1
        ends = {e for _, e in bounds}
        store.note_bodies([prompt[s:e] for s, e in a.req.spans if e in ends], collection=a.req.collection,
                          scope=a.req.cache_scope)
        return kept

    # -- warming ---------------------------------------------------------------------

    def wanted(self, passages: Sequence[tuple[str, list[int]]]) -> int:
        """Queue ``(key, tokens)`` passages to warm when the engine is idle
        (those stored or queued already are left out); how many were queued."""
        if not self.enabled or self.store.fresh is None:  # exact segments are kept as prompts are answered
            return 0
        queued = 0
        with self._lock:
            for key, tokens in passages:
                if key in self._warm or self.store.holds(key):
                    continue
                self._warm[key] = tokens
                queued += 1
            while len(self._warm) > WARM_QUEUE:
                self._warm.popitem(last=False)
        return queued

    def warm_size(self) -> int:
        """Passages waiting to be warmed."""
        with self._lock:
            return len(self._warm)

    def next_warm(self, system: Sequence[int]) -> Request | None:
        """The request that evaluates the next passage to warm behind
        ``system``, or None when there is none (or no system prompt yet)."""
        if not system:
            return None
        with self._lock:
            while self._warm:
                key, tokens = self._warm.popitem(last=False)
                if not self.store.holds(key):
                    return Request(0, [*system, *tokens], 0, store=key, background=True, idle=True)
        return None

    def give_back(self, request: Request, canonical: int) -> None:
        """Queue again, first, a warming ``request`` that gave way to others."""
        if request.store is not None:
            with self._lock:
                self._warm[request.store] = request.tokens[canonical:]
                self._warm.move_to_end(request.store, last=False)
