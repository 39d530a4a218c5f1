"""The engine's loop: one thread owns the llama.cpp context and, step after
step, evaluates one batch for every request it holds (see ``scheduler``).

Sequence 0 holds the system prompt, computed once; a new request starts
from the longest prefix of its prompt already held (``placement``), and
stored passages' KV is spliced in where its prompt holds them (``splicing``);
in idle time the loop evaluates passages to store. Prompts are evaluated in chunks
between the decode steps of the others. A request that is cancelled (its
consumer closed the generation) gives its sequence back at the next step.
Each request's timings are its own: a step's time is shared among the
tokens in it, so a request's prefill and decode seconds are what its tokens
cost, and everything else before its first token is waiting.
Whatever fails, every request is told how it ended: a failed step ends the
requests in it, a failure outside a step those held and waiting, and a loop
that cannot go on ends them all and refuses new ones; a shared system prompt
that a failure lost is loaded again at later steps until it is back.

Does not: tokenize, render prompts, or decide priorities (``scheduler``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..errors import ContextOverflow, EngineError, GenerationCancelled, GenerationFailed
from .snapshots import SnapshotCache
from .native import Entry, NativeContext, Sampler
from .passage_kv import PassageStore
from .placement import DEFERRED, SYSTEM_SEQ, Placement
from .requests import Active, Request, share_step, timings_of
from ..scheduler import (BACKGROUND_STEP_S, BACKGROUND_STEP_TOKENS, BUSY_STEP_S, BUSY_STEP_TOKENS, Load, Step,
                         StepStats, admission_order, others_cells, plan_step)
from .slots import SlotTable
from .splicing import Splicer
from .kept_state import keep_state
from .system_prompt import SystemPrompt
from .recovery import FailureStreak, told_error
from .warming import warming_turn

log = logging.getLogger("rag_budget.engine")
# How often a consumer waiting for its next event checks that the loop's thread is still alive (a
# liveness guard, not in the timing path: an event wakes the consumer at once).
LIVENESS_POLL_S = 1.0


class Published(NamedTuple):
    """The loop's state as other threads read it, replaced whole after each
    step so a reader never sees half of one step and half of the next."""

    active: list  # Work of the requests holding a sequence (warming left out)
    waiting: list  # Work of those waiting for one (warming left out)
    free: int  # idle sequences
    held: list  # what each idle sequence holds (np.ndarray) and the cache scope it is of
    warming: int  # warming requests, running or waiting
    cells: int = 0  # KV cells the sequences hold, the shared system prompt once


class EngineLoop:
    """The thread that runs every request on one :class:`NativeContext`."""

    def __init__(self, ctx: NativeContext, *, slots: int, kv_cells: int, snapshots: SnapshotCache,
                 detokenize: Callable[[int], bytes], is_end: Callable[[int], bool], repeat_penalty: float,
                 busy_step_tokens: int = BUSY_STEP_TOKENS, passages: PassageStore | None = None) -> None:
        self.ctx, self.kv_cells, self.snapshots = ctx, kv_cells, snapshots
        self.splicer = Splicer(ctx, passages, scratch=ctx.n_seq_max - 1)  # the last sequence is its scratch
        self._detokenize, self._is_end, self._penalty = detokenize, is_end, repeat_penalty
        # Prompt tokens a step takes, while others decode and else: at least these, more where this
        # engine's measured rate fits more in the same seconds (``_measured_step_sizes``).
        self._least = (min(busy_step_tokens, ctx.n_batch), min(BACKGROUND_STEP_TOKENS, ctx.n_batch))
        self.busy_step_tokens, self.idle_step_tokens = self._least[0], ctx.n_batch
        self.background_step_tokens = self._least[1]
        self._cv = threading.Condition()
        self._inbox: list[Request] = []
        self._waiting: list[Request] = []
        self._active: dict[int, Active] = {}
        self.slots = SlotTable(slots)
        self.placement = Placement(ctx, self.slots, snapshots, kv_cells)
        self.splicer.make_room = self._make_room
        self.system_prompt = SystemPrompt()  # what sequence 0 holds, and its reloads once a failure lost it
        self.stats = StepStats()
        # Read by other threads without racing the loop: works, waiting works, free slots, idle prompts, warming.
        self._published = Published([], [], slots, [], 0)
        self._stop, self._keys = False, 0  # both guarded by ``_cv``
        self._ended: str | None = None  # why the loop ended (new requests are refused with it); under ``_cv``
        self._forget: list[threading.Event] = []  # asked to drop idle sequences' prompts
        self._turns = 0  # turns taken (each a step, or a pass that found none): the system prompt's retry clock
        self._thread = threading.Thread(target=self._run, name="rag-engine", daemon=True)
        self._thread.start()

    # -- from other threads ----------------------------------------------------

    def submit(self, request: Request) -> Request:
        """Queue ``request``; its events arrive on ``request.events``. Once
        the loop has ended (stopped, or failed beyond recovery) it is told
        so at once instead."""
        request.stored, request.pieces = self.splicer.stored(request, self.system)  # as the load others see counts it
        with self._cv:
            if self._stop:  # nothing would ever answer it
                request.fail(GenerationFailed(self._ended or "the engine stopped"))
                return request
            self._new_key(request)
            self._inbox.append(request)
            self._cv.notify()
        return request

    def _new_key(self, request: Request) -> None:
        # Keys index the loop's requests: two sharing one would be placed twice. Called with ``_cv`` held.
        self._keys += 1
        request.key = self._keys

    def next_event(self, request: Request, poll_s: float = LIVENESS_POLL_S) -> tuple[str, object]:
        """The next event of ``request`` (see :class:`Request`), waiting as
        long as the loop runs: should its thread end without telling the
        request (which its guard is there to prevent), an error event
        instead of a wait for ever."""
        while True:
            try:
                return request.events.get(timeout=poll_s)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
            try:
                return request.events.get_nowait()  # told just before the thread ended
            except queue.Empty:
                return "error", GenerationFailed("the engine loop ended without answering this request; "
                                                 "restart the engine")

    def alive(self) -> bool:
        """Whether the loop takes requests (not stopped, not failed beyond recovery)."""
        with self._cv:
            return not self._stop and self._thread.is_alive()

    @property
    def system(self) -> list[int]:
        """The tokens sequence 0 holds as the shared system prompt (empty: none, lost or being rebuilt)."""
        return self.system_prompt.tokens

    @property
    def system_retries(self) -> int:
        """Failed loads of the pinned system prompt since a failure lost it (0: not lost)."""
        return self.system_prompt.retries

    def system_state(self) -> str:
        """The shared system prompt as reports show it (see :meth:`SystemPrompt.state`)."""
        return self.system_prompt.state()

    @property
    def published(self) -> Published:
        """The loop's state after its last step (see :class:`Published`)."""
        return self._published

    def warm(self, passages: Sequence[tuple[str, list[int]]]) -> int:
        """Evaluate and keep these ``(key, tokens)`` passages while the engine
        has nothing else to do; how many were queued."""
        queued = self.splicer.wanted(passages)
        if queued:
            with self._cv:
                self._cv.notify()
        return queued

    def forget_prompts(self, wait_s: float = 30.0) -> None:
        """Drop what idle sequences hold, so the next prompts find only the
        system prompt and saved snapshots cached (for measurements)."""
        done = threading.Event()
        with self._cv:
            if self._stop:  # nothing would ever answer it (and idle prompts are gone with the loop)
                return
            self._forget.append(done)
            self._cv.notify()
        done.wait(wait_s)

    def cancel(self, request: Request, wait_s: float = 30.0) -> None:
        """Stop ``request`` and wait (up to ``wait_s``; 0: not at all) until
        its sequence is free: it is dropped before the next step (the step
        in flight, one llama.cpp call, is not interrupted) and ends with a
        :class:`GenerationCancelled` event."""
        request.cancelled.set()
        with self._cv:
            self._cv.notify()
        request.released.wait(wait_s)

    def load(self) -> Load:
        """The engine as a new request would find it now: what holds a
        sequence, what waits for one (less the shared system prefix each
        will find cached), the step sizes (prompt tokens a step takes) and the measured decode steps."""
        with self._cv:
            published = self._published  # one step's state, whole
            active, waiting = published.active, published.waiting
            waiting = [*waiting, *(r.work() for r in self._inbox)]
            steps = self.stats.decode_steps()
            now = time.perf_counter()
            running, ran_s = self.stats.in_flight(now)
        shared = len(self.system)
        waiting = [replace(w, to_prefill=max(w.to_prefill - shared, 1), context=shared) for w in waiting]
        return Load(tuple(active), tuple(waiting), self.slots.size, self.busy_step_tokens, self.idle_step_tokens,
                    self.ctx.n_batch, steps, running, ran_s, self.stats.mixed_steps(), cells=published.cells)

    def warming(self) -> int:
        """Requests warming the passage store, running or waiting."""
        return self._published.warming

    def held_prompts(self, scope: str = "") -> list[np.ndarray]:
        """What the idle sequences of cache ``scope`` hold (a cached prefix
        for its next prompt; another scope's are never a prompt's)."""
        with self._cv:
            return [tokens for tokens, of in self._published.held if of == scope]

    def stop(self) -> None:
        """End the loop; requests still held or waiting get an error."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=60)

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        """Turn after turn until stopped. Whatever a turn raises outside a
        step (a step's own failure is recovered from inside it) is recovered
        from at once, as its :class:`FailureStreak` says: every request held
        is told (those waiting are placed afterwards, as after a failed
        step), at the streak's limit those waiting too; past it, or on
        anything worse than an Exception, the loop ends, telling every
        request left and refusing new ones."""
        streak, ended = FailureStreak(), None
        try:
            while True:
                try:
                    if streak.recovering:
                        self._recover(streak.last)
                        if streak.tell_waiting:  # a request still queued may be the cause: told, not tried again
                            self._fail_waiting(streak.last)
                        self._publish()  # what the engine holds now, before it waits for work
                    if not self._turn():
                        break
                    streak.passed()
                except Exception as exc:  # noqa: BLE001 - no exception may end the thread untold
                    log.error("the engine loop failed outside a step (%d in a row): %r", streak.count + 1, exc,
                              exc_info=exc)
                    streak.failed(exc)  # past its limit, with nothing held or queued: the loop itself
        except BaseException as exc:  # noqa: BLE001 - whatever it was, every request is told below
            ended = f"the engine loop failed and stopped ({exc!r}); restart the engine"
            log.critical("%s", ended, exc_info=exc)
        finally:
            self._end(ended or "the engine stopped")

    def _turn(self) -> bool:
        """One turn: wait for work, take what arrived, drop idle prompts if
        asked, then plan and run one step; False once stopped."""
        with self._cv:
            while not (self._stop or self._inbox or self._active or self._waiting or self._can_warm()
                       or self._forget or self.system_prompt.quick_tries):
                self._cv.wait()
            if self._stop:
                return False
            # Still published as waiting until this step's publish: a request taken from the inbox is
            # never out of the load another thread plans against (placing it may take a while).
            arrived = [r.work() for r in self._inbox if not r.idle]
            if arrived:
                self._published = self._published._replace(waiting=[*self._published.waiting, *arrived])
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            forget, self._forget = self._forget, []
        self._turns += 1
        try:
            if forget:
                self._give_up_idle()
        finally:
            for done in forget:  # answered whatever happened: the caller does not wait out its guard
                done.set()
        try:
            self._retry_system()
            self._warm_or_give_way()
            self._drop_cancelled()
            self._admit()
            self._publish()
            step = plan_step([a.work() for a in self._active.values()], busy_step_tokens=self.busy_step_tokens,
                             idle_step_tokens=self.idle_step_tokens, n_batch=self.ctx.n_batch,
                             background_step_tokens=self.background_step_tokens)
            if step.tokens:
                self._execute(step)
        except Exception as exc:  # noqa: BLE001 - no request may hang on a failed step: all are told
            self._recover(exc)
        self._publish()
        return True

    def _end(self, why: str) -> None:
        """The loop ends: new requests are refused with ``why``, and every
        request held or waiting is told it (each whatever telling another
        costs), every caller of :meth:`forget_prompts` answered."""
        with self._cv:
            self._stop, self._ended = True, why  # from now on nothing enters the inbox
            forget, self._forget = self._forget, []
        for done in forget:
            done.set()
        for active in list(self._active.values()):
            try:
                self._finish(active, error=GenerationFailed(why))
            except Exception as exc:  # noqa: BLE001 - it was told before its release failed
                log.warning("releasing a request as the engine ended failed: %r", exc)
        self._active.clear()
        self._fail_waiting(GenerationFailed(why))
        try:
            self._publish()
        except Exception:  # noqa: BLE001 - only what other threads read; nothing waits on it
            log.warning("publishing the ended engine's state failed", exc_info=True)

    def _recover(self, exc: Exception) -> None:
        """After a failed step, or a failure outside one: every request held
        is told, its sequence cleared and released; those waiting stay queued
        (none has touched the context, and they are placed only after every
        idle cache is given up and the system prompt restored, so the state
        they meet is known); the system prompt stays (a step only adds cells
        to the sequences in it), or is loaded again from its pinned snapshot
        when it was being rebuilt, so splicing and warming go on."""
        log.warning("an engine step failed: %r", exc)
        error = told_error(exc)
        self.stats.abandon()  # a step that raised was not run, whatever it raised from
        for active in list(self._active.values()):
            self._finish(active, error=error)  # a system prompt being rebuilt is loaded again there
        self.ctx.remove(self.splicer.scratch)
        self._give_up_idle()  # idle caches are only a cache: none is trusted after a failure
        if not self.system and not self.system_retries:
            self._restore_system()

    def _fail_waiting(self, exc: Exception) -> None:
        """Tell every request waiting for a sequence, or not yet taken in, that it failed with ``exc``."""
        error = told_error(exc)
        with self._cv:
            queued, self._inbox = self._inbox, []
        for request in [*self._waiting, *queued]:
            request.fail(error)
        self._waiting.clear()

    def _retry_system(self) -> None:
        """Load a lost system prompt again when its next try is due (never
        while sequence 0 is being rebuilt: that request sets it)."""
        if self.system_prompt.due(self._turns) and not any(a.seq == SYSTEM_SEQ for a in self._active.values()):
            self._restore_system()

    def _restore_system(self) -> None:
        """Load the system prompt again from its pinned snapshot."""
        self.ctx.remove(SYSTEM_SEQ)
        self._hold_system(self.placement.restore_system())

    def _hold_system(self, tokens: Sequence[int]) -> None:
        self.system_prompt.held(tokens, pinned=self.snapshots.pinned() is not None, turn=self._turns)

    def _make_room(self) -> bool:
        """Give up every idle sequence's cache; whether at most one request holds cells."""
        self._give_up_idle()
        return len(self._active) <= 1

    def _give_up_idle(self) -> int:
        """Clear every idle sequence that holds cells (a cache only: its
        snapshot stays); how many were cleared."""
        cleared = self.slots.evict(self.kv_cells)
        for seq in cleared:
            self.ctx.remove(seq)
        return len(cleared)

    def _can_warm(self) -> bool:
        return bool(self.system) and self.splicer.warm_size() > 0

    def _warm_or_give_way(self) -> None:
        """Carry out this turn's :func:`warming_turn`: warming requests give
        way (their passages queued again), or one starts."""
        turn = warming_turn(self._active.values(), self._waiting)
        for a in turn.stop:
            self.splicer.give_back(a.req, len(self.system))
            self._finish(a, cancelled=True)
        for r in turn.unqueue:
            self._waiting.remove(r)
            self.splicer.give_back(r, len(self.system))
            r.released.set()
        if turn.start:
            request = self.splicer.next_warm(self.system)
            if request is not None:
                with self._cv:
                    self._new_key(request)
                self._waiting.append(request)

    def _publish(self) -> None:
        # Warming gives way to any request at the next step: the load a new request meets leaves it out
        # (what is left of its step in flight aside), and only its count is published.
        warming = sum(a.req.idle for a in self._active.values()) + sum(r.idle for r in self._waiting)
        held = self.slots.held()
        # KV cells the sequences hold, the system prompt's (which every sequence shares) once: each
        # prompt token evaluated passes over all of them, the other sequences' masked.
        system = len(self.system)
        cells = system + sum(max(n - system, 0) for n in [*(a.n_past for a in self._active.values()),
                                                          *(len(tokens) for tokens, _ in held)])
        with self._cv:
            self._published = Published([a.work() for a in self._active.values() if not a.req.idle],
                                        [r.work() for r in self._waiting if not r.idle], self.slots.free,
                                        held, warming, cells)

    def _drop_cancelled(self) -> None:
        # Told, not only released: a consumer still waiting for its first piece on
        # another thread (a client that went away) wakes up and ends.
        for request in [r for r in self._waiting if r.cancelled.is_set()]:
            self._waiting.remove(request)
            request.fail(GenerationCancelled("the request was cancelled"))
        for active in [a for a in self._active.values() if a.req.cancelled.is_set()]:
            self._finish(active, error=GenerationCancelled("the request was cancelled"))

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
            try:
                active = self.placement.place(request, self.system, sum(a.reserved for a in self._active.values()))
            except Exception as exc:  # noqa: BLE001 - placing failed (a snapshot load): the sequence went back
                log.warning("placing a request failed: %r", exc)
                self._waiting.remove(request)
                request.fail(told_error(exc))
                continue
            if active is DEFERRED:  # its snapshot is still on its way from disk: it waits, those behind it go on
                continue
            if request.pin and active is not None:
                self.system_prompt.rebuilding()
            if active is None and request.released.is_set():  # refused outright: already told why
                self._waiting.remove(request)
                continue
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
            self.splicer.plan(active, self.system)

    def _execute(self, step: Step) -> None:
        """Evaluate one batch, share its time among its tokens, and sample."""
        step = self.splicer.capped(step, self._active, self.busy_step_tokens)
        if not step.tokens:
            return
        entries, owners = [], []
        for key in step.decode:
            a = self._active[key]
            entries.append(Entry(a.pending, a.n_past, a.seq, True))
            owners.append((a, False))
        for key, n in step.prefill:
            a = self._active[key]
            if a.others is None:  # its prompt starts being evaluated: what the others hold (published just before)
                a.others = others_cells(self._published.cells, max(a.n_past, len(self.system)))
            done = a.next + n == len(a.req.tokens) and not a.req.prefill_only
            for i in range(a.next, a.next + n):
                entries.append(Entry(a.req.tokens[i], a.n_past + i - a.next, a.seq, done and i == a.next + n - 1))
                owners.append((a, True))
        started = time.perf_counter()
        self.stats.begin(step, started)
        if self.ctx.decode(entries) == 1:  # (a step that raises is abandoned by ``_recover``)
            self.stats.abandon()  # nothing ran: the load must not advance work by it
            self._no_room(step)
            return
        samples = [(a, self._sample(a, i)) for i, (e, (a, _)) in enumerate(zip(entries, owners)) if e.logits]
        seconds = share_step(owners, time.perf_counter() - started)
        self.stats.count(len(step.decode), [(n, self._active[key].n_past) for key, n in step.prefill], seconds,
                         self._published.cells)
        self._measured_step_sizes()
        for key in step.decode:
            self._active[key].n_past += 1
        for key, n in step.prefill:
            a = self._active[key]
            a.next, a.n_past = a.next + n, a.n_past + n
            self.splicer.catch_up(a, len(self.system))
            if a.next == len(a.req.tokens) and a.req.prefill_only:
                self._finish(a)
        for a, token in samples:
            self._take(a, token)

    def _measured_step_sizes(self) -> None:
        """The step sizes after a step ran (any halving by ``_no_room``
        undone): as many prompt tokens as fit ``BUSY_STEP_S`` and
        ``BACKGROUND_STEP_S`` at this engine's measured rate, never fewer
        than those it was made with, never more than ``n_batch``."""
        n_batch = self.ctx.n_batch
        self.busy_step_tokens = self.stats.step_tokens(BUSY_STEP_S, self._least[0], n_batch)
        self.idle_step_tokens = n_batch
        self.background_step_tokens = self.stats.step_tokens(BACKGROUND_STEP_S, self._least[1], n_batch)

    def _sample(self, a: Active, index: int) -> int:
        """The next token of ``a`` from batch entry ``index`` (a traced request records it)."""
        token = a.sampler.sample(self.ctx, index)
        return token if a.req.trace is None else a.req.trace.take(token, self.ctx.logits(index))

    def _no_room(self, step: Step) -> None:
        """The batch did not fit the KV cache: give up idle sequences' caches,
        else take less prompt next time, or give up the most recent request
        when even the decodes do not fit."""
        if self._give_up_idle():
            return  # the same step is tried again with their cells free
        if step.prefill and self.busy_step_tokens > 1:
            self.busy_step_tokens, self.idle_step_tokens = max(self.busy_step_tokens // 2, 1), max(self.idle_step_tokens // 2, 1)
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
        if len(a.generated) >= a.req.max_tokens or a.says_stop(piece):  # a stop: not one step more
            self._finish(a)
        else:
            a.pending = token

    def _finish(self, a: Active, *, cancelled: bool = False, error: EngineError | None = None) -> None:
        """End ``a``: its tail text, what it leaves for later prompts
        (:func:`keep_state`), its sequence left holding its tokens for
        the next prompt (the system prompt's kept as the shared prefix), its
        timings. Whatever fails here, the request is told and its sequence
        released."""
        self._active.pop(a.req.key, None)
        req, ok = a.req, error is None and not cancelled
        held = (req.tokens + a.generated)[: a.n_past] if ok else []
        snapshot_s = 0.0
        try:
            if ok:
                tail = a.decoder.decode(b"", final=True)
                if tail:
                    req.events.put(("piece", tail))
                held, snapshot_s = keep_state(self.ctx, self.snapshots, self.splicer, a, held, self.system)
        except Exception as exc:  # noqa: BLE001 - told below, never left hanging
            log.warning("finishing a request failed: %r", exc)
            ok, held = False, []
            error = told_error(exc)
        finally:
            try:
                self._release(a, held)
            finally:  # told even when releasing raised (that goes on to the loop's recovery)
                if ok:
                    req.events.put(("done", timings_of(a, snapshot_s)))
                elif error is not None:
                    req.events.put(("error", error))
                req.released.set()

    def _release(self, a: Active, held: list[int]) -> None:
        """Give ``a``'s sequence back holding ``held`` (nothing: cleared) and free its sampler."""
        if a.sampler is not None:
            a.sampler.close()
            a.sampler = None
        if a.seq != SYSTEM_SEQ:
            self.slots.release(a.seq, held, a.req.cache_scope)
        if not held:
            self.ctx.remove(a.seq)
        if a.seq == SYSTEM_SEQ and held:
            self._hold_system(held)
        elif a.seq == SYSTEM_SEQ:  # not rebuilt (failed, cancelled): the one before, from its pinned snapshot
            self._restore_system()
