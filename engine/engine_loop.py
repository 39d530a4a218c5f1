"""The engine's loop: one thread owns the llama.cpp context and, step after
step, evaluates one batch for every request it holds (see ``scheduler``).

Sequence 0 holds the system prompt, computed once; a new request starts
from the longest prefix of its prompt already held: an idle sequence's
previous prompt (``slots``), a saved snapshot of its session, or the system
prompt's cells, shared without a copy. Prompts are evaluated in chunks
between the decode steps of the others. A request that is cancelled (its
consumer closed the generation) gives its sequence back at the next step.
Each request's timings are its own: a step's time is shared among the
tokens in it, so a request's prefill and decode seconds are what its tokens
cost, and everything else before its first token is waiting.

Does not: tokenize, render prompts, or decide priorities (``scheduler``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from .errors import ContextOverflow, EngineError, GenerationFailed
from .kv_snapshots import Snapshot, SnapshotCache, common_prefix
from .llama_native import Entry, NativeContext, Sampler
from .requests import Active, Request, timings_of
from .scheduler import Load, Step, admission_order, load_for, plan_step
from .slots import SlotTable

SYSTEM_SEQ = 0


class EngineLoop:
    """The thread that runs every request on one :class:`NativeContext`."""

    def __init__(self, ctx: NativeContext, *, slots: int, kv_cells: int, snapshots: SnapshotCache,
                 detokenize: Callable[[int], bytes], is_end: Callable[[int], bool], repeat_penalty: float,
                 busy_budget: int = 64) -> None:
        self.ctx, self.kv_cells, self.snapshots = ctx, kv_cells, snapshots
        self._detokenize, self._is_end, self._penalty = detokenize, is_end, repeat_penalty
        self._budgets = (busy_budget, ctx.n_batch)  # prompt tokens a step takes: while others decode, else
        self.busy_budget, self.idle_budget = self._budgets
        self._cv = threading.Condition()
        self._inbox: list[Request] = []
        self._waiting: list[Request] = []
        self._active: dict[int, Active] = {}
        self.slots = SlotTable(slots)
        self.system: list[int] = []  # the tokens sequence 0 holds
        self._step_s: dict[int, float] = {}  # decode-only step seconds by batch size (moving average)
        self.counters = {"steps": 0, "decode_steps": 0, "decode_tokens": 0, "prefill_tokens": 0}
        # What other threads may read without racing the loop: works, waiting works, free slots, idle prompts.
        self._published: tuple = ([], [], slots, [])
        self._stop, self._keys = False, 0
        self._thread = threading.Thread(target=self._run, name="rag-engine", daemon=True)
        self._thread.start()

    # -- from other threads ----------------------------------------------------

    def submit(self, request: Request) -> Request:
        """Queue ``request``; its events arrive on ``request.events``."""
        with self._cv:
            self._keys += 1
            request.key = self._keys
            self._inbox.append(request)
            self._cv.notify()
        return request

    def cancel(self, request: Request, wait_s: float = 30.0) -> None:
        """Stop ``request`` and wait (up to ``wait_s``) until its sequence is free."""
        request.cancelled.set()
        with self._cv:
            self._cv.notify()
        request.released.wait(wait_s)

    def load(self, deadline: float) -> Load:
        """The load a foreground request with ``deadline`` would meet now."""
        with self._cv:
            active, waiting, free, _ = self._published
            waiting = [*waiting, *(r.work() for r in self._inbox)]
        generating = sum(1 for w in active if w.generating)
        return load_for(active, waiting, deadline, busy_budget=self.busy_budget,
                        decode_step_s=self.decode_step_s(max(generating, 1)), free_slots=free)

    def held_prompts(self) -> list[np.ndarray]:
        """What the idle sequences hold (a cached prefix for the next prompt)."""
        with self._cv:
            return list(self._published[3])

    def decode_step_s(self, batch: int) -> float:
        """Measured seconds of a decode step with ``batch`` sequences (the
        nearest size measured, scaled up for a larger one; 0 before any)."""
        if not self._step_s:
            return 0.0
        nearest = min(self._step_s, key=lambda b: abs(b - batch))
        return self._step_s[nearest] * (batch / nearest if nearest < batch else 1.0)

    def stop(self) -> None:
        """End the loop; requests still held or waiting get an error."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=60)

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._inbox or self._active or self._waiting):
                    self._cv.wait()
                if self._stop:
                    break
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            try:
                self._drop_cancelled()
                self._admit()
                self._publish()
                step = plan_step([a.work() for a in self._active.values()], busy_budget=self.busy_budget,
                                 idle_budget=self.idle_budget, n_batch=self.ctx.n_batch)
                if step.tokens:
                    self._execute(step)
            except Exception as exc:  # noqa: BLE001 - no request may hang on a failed step: all are told
                error = exc if isinstance(exc, EngineError) else GenerationFailed(f"the engine failed ({exc!r})")
                for active in list(self._active.values()):
                    self._finish(active, error=error)
                self.ctx.clear()
                self.system = []
                self.slots.evict(self.kv_cells)  # every cell is gone: no idle sequence holds a prompt
            self._publish()
        for active in list(self._active.values()):
            self._finish(active, error=GenerationFailed("the engine stopped"))
        for request in self._waiting + self._inbox:
            request.fail(GenerationFailed("the engine stopped"))

    def _publish(self) -> None:
        with self._cv:
            self._published = ([a.work() for a in self._active.values()], [r.work() for r in self._waiting],
                               self.slots.free, self.slots.held())

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._waiting if r.cancelled.is_set()]:
            self._waiting.remove(request)
            request.released.set()
        for active in [a for a in self._active.values() if a.req.cancelled.is_set()]:
            self._finish(active, cancelled=True)

    def _admit(self) -> None:
        """Give sequences to waiting requests, most urgent first, while the
        KV cache has room for them (idle sequences' caches give way)."""
        order = admission_order([r.work() for r in self._waiting])
        by_key = {r.key: r for r in self._waiting}
        for work in order:
            request = by_key[work.key]
            if request.pin and any(a.seq == SYSTEM_SEQ for a in self._active.values()):
                continue
            if not request.pin and not self.slots.free:
                break
            active = self._place(request)
            if active is None:  # no room until others finish
                if not self._active:
                    self._waiting.remove(request)
                    request.fail(ContextOverflow(
                        f"{len(request.tokens)} prompt tokens + {request.max_tokens} answer tokens do not fit "
                        f"the engine's KV cache of {self.kv_cells} cells"))
                break
            self._waiting.remove(request)
            if not request.prefill_only:
                active.sampler = Sampler(self.ctx.n_vocab, repeat_penalty=self._penalty)
            self._active[request.key] = active

    def _room(self, need: int) -> bool:
        """Whether ``need`` more cells fit, after giving up idle caches if needed."""
        used = len(self.system) + sum(a.reserved for a in self._active.values()) + self.slots.idle_cells()
        short = used + need - self.kv_cells
        if short > 0:
            for seq in self.slots.evict(short):
                self.ctx.remove(seq)
            short = len(self.system) + sum(a.reserved for a in self._active.values()) + need - self.kv_cells
        return short <= 0

    def _place(self, request: Request) -> Active | None:
        """Start ``request`` from the longest prefix held: an idle sequence's
        prompt, a saved snapshot, or the system prompt's cells; None if the
        cache has no room for it now."""
        tokens, ctx, budget = request.tokens, self.ctx, len(request.tokens) + request.max_tokens + 1
        if request.pin:
            ctx.remove(SYSTEM_SEQ)
            self.system = []
            return Active(request, SYSTEM_SEQ, len(tokens), 0, 0, 0)
        limit = len(tokens) - 1  # the last prompt token is always evaluated, for its logits
        system = min(common_prefix(np.asarray(self.system, dtype=np.int32), np.asarray(tokens, dtype=np.int32)), limit)
        idle_seq, idle = self.slots.best(tokens)
        key, saved = self.snapshots.best(tokens)
        idle, saved = min(idle, limit), min(saved, limit)
        if idle_seq is not None and idle >= max(saved, system) and idle > 0:
            if not self._room(budget - idle):
                return None
            seq, _ = self.slots.take(idle_seq)
            ctx.remove(seq, idle, -1)
            return Active(request, seq, budget - idle, idle, idle, idle)
        if not self._room(budget - (system if saved <= system else 0)):
            return None
        seq, held = self.slots.take()
        if held:
            ctx.remove(seq)
        if key is not None and saved > system:
            started = time.perf_counter()
            snap = self.snapshots.get(key)
            if snap is not None and ctx.load(seq, snap.data):
                ctx.remove(seq, saved, -1)  # what follows the common prefix is evaluated again
                return Active(request, seq, budget, saved, saved, saved, saved, time.perf_counter() - started)
            self.snapshots.discard(key)  # not a state of this model and context
            ctx.remove(seq)
        if system:
            ctx.share(SYSTEM_SEQ, seq, 0, system)
        return Active(request, seq, budget - system, system, system, system)

    def _execute(self, step: Step) -> None:
        """Evaluate one batch, share its time among its tokens, and sample."""
        entries, owners = [], []
        for key in step.decode:
            a = self._active[key]
            entries.append(Entry(a.pending, a.n_past, a.seq, True))
            owners.append((a, False))
        for key, n in step.prefill:
            a = self._active[key]
            done = a.next + n == len(a.req.tokens) and not a.req.prefill_only
            for i in range(a.next, a.next + n):
                entries.append(Entry(a.req.tokens[i], a.n_past + i - a.next, a.seq, done and i == a.next + n - 1))
                owners.append((a, True))
        started = time.perf_counter()
        if self.ctx.decode(entries) == 1:
            self._no_room(step)
            return
        self.busy_budget, self.idle_budget = self._budgets
        samples = [(a, a.sampler.sample(self.ctx, i)) for i, (e, (a, _)) in enumerate(zip(entries, owners))
                   if e.logits]
        self._account(step, owners, time.perf_counter() - started)
        for key in step.decode:
            self._active[key].n_past += 1
        for key, n in step.prefill:
            a = self._active[key]
            a.next, a.n_past = a.next + n, a.n_past + n
            if a.next == len(a.req.tokens) and a.req.prefill_only:
                self._finish(a)
        for a, token in samples:
            self._take(a, token)

    def _account(self, step: Step, owners: list, seconds: float) -> None:
        """Share a step's ``seconds`` among its tokens, and count it."""
        share = seconds / len(owners)
        for a, prompt in owners:
            if prompt:
                a.prefill_s += share
            else:
                a.decode_s += share
        c = self.counters
        c["steps"] += 1
        c["prefill_tokens"] += sum(n for _, n in step.prefill)
        if step.decode:
            c["decode_steps"] += 1
            c["decode_tokens"] += len(step.decode)
            if not step.prefill:  # a decode-only step: how long one of this many takes
                n, before = len(step.decode), self._step_s.get(len(step.decode))
                self._step_s[n] = seconds if before is None else 0.8 * before + 0.2 * seconds

    def _no_room(self, step: Step) -> None:
        """The batch did not fit the KV cache: take less prompt next time, or
        give up the most recent request when even the decodes do not fit."""
        if step.prefill and self.busy_budget > 1:
            self.busy_budget, self.idle_budget = max(self.busy_budget // 2, 1), max(self.idle_budget // 2, 1)
            return
        newest = max(self._active.values(), key=lambda a: a.req.started)
        self._finish(newest, error=GenerationFailed("the engine's KV cache is full; try again"))

    def _take(self, a: Active, token: int) -> None:
        """One sampled token of ``a``: streamed, or the end of its answer."""
        if a.first_token_at is None:
            a.first_token_at = time.perf_counter()
        if self._is_end(token):
            self._finish(a)
            return
        a.generated.append(token)
        piece = a.decoder.decode(self._detokenize(token))
        if piece:
            a.req.events.put(("piece", piece))
        if len(a.generated) >= a.req.max_tokens:
            self._finish(a)
        else:
            a.pending = token

    def _finish(self, a: Active, *, cancelled: bool = False, error: EngineError | None = None) -> None:
        """End ``a``: its tail text, its state saved for its session, its
        sequence left holding its tokens for the next prompt (the system
        prompt's kept as the shared prefix), its timings."""
        self._active.pop(a.req.key, None)
        req, ok = a.req, error is None and not cancelled
        held = (req.tokens + a.generated)[: a.n_past] if ok else []
        snapshot_s = 0.0
        if ok:
            tail = a.decoder.decode(b"", final=True)
            if tail:
                req.events.put(("piece", tail))
            if req.session is not None and held:
                began = time.perf_counter()
                data = self.ctx.save(a.seq)
                if data:
                    self.snapshots.put(req.session, Snapshot(np.asarray(held, dtype=np.int32), data), pin=req.pin)
                snapshot_s = time.perf_counter() - began
        if a.seq == SYSTEM_SEQ:
            self.system = list(held)
        else:
            self.slots.release(a.seq, held)
        if not held:
            self.ctx.remove(a.seq)
        if a.sampler is not None:
            a.sampler.close()
        if ok:
            req.events.put(("done", timings_of(a, snapshot_s)))
        elif error is not None:
            req.events.put(("error", error))
        req.released.set()
