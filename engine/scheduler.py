"""Who the engine works for next: pure decisions, no model.

Each step of the engine's loop evaluates one batch: one token for every
sequence that is generating (on a GPU decode is bandwidth-bound and the
step costs little more than one of them; on a small CPU it grows with the
batch, which is why the estimates below use measured step times), then as many prompt tokens of sequences
still prefilling as the step's size allows (prefill is compute-bound, so
it is spent where a deadline needs it). Prompts are served earliest
deadline first; requests without a deadline after those with one, in
arrival order; background work (a summary, a prefix prefilled ahead) last,
and only while no request with a deadline has prompt tokens waiting.

A request's wait under the current load is estimated by running the same
rules forward over what the engine holds and what waits for it: the prompt
tokens that go before it, the decode steps interleaved with them, and the
sequences that must free first when none is free.

Does not: touch llama.cpp, measure time, or plan prompts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Sequence

FOREGROUND, BACKGROUND = 0, 1
# Prompt tokens a step of background work (a summary's prompt, a new prefix, warming) takes at most,
# even on an idle engine: a step is never interrupted, so a question that arrives meanwhile waits for
# the rest of it. Measured in `rag bench chat --back-to-back`: a summary prompt of 445 tokens in one
# step of 1.8 s put a question at 3.9 s against its 2 s target; 128 tokens take about half a second.
BACKGROUND_STEP_TOKENS = 128
# Prompt tokens a step takes while others decode, at least: each such step also carries every
# stream's token and its fixed cost, and a long prompt pauses the streams a step at a time. Measured
# (8 clients, `rag bench serve`, 2-core CPU): p95 TTFT 4.0-4.7 s with 64, 2.4-2.8 s with 256, 3.1 s with 512.
BUSY_STEP_TOKENS = 256
# Both token counts are what a step of these seconds held on that CPU (about 300 prompt tokens a second
# beside decodes): an engine that evaluates prompt tokens faster (a GPU) takes as many as fit the same
# seconds at its own measured rate (:meth:`StepStats.step_tokens`), so its steps pause the streams no
# longer, and a long prompt is not cut into hundreds of millisecond steps.
BUSY_STEP_S = 0.85
BACKGROUND_STEP_S = 0.4
RATE_MIN_TOKENS = 32  # a step of fewer prompt tokens says more about the step's fixed cost than about the rate
# A prompt that ends in a step shares it only with prompts due at most this much later: all of a
# step's first tokens come at its end, so a later prompt's tokens there delay the earlier one's.
# Measured (8 clients): 171 tokens of a prompt due 1.1 s later, in the step that ended two others'
# prompts, put their first tokens 0.6 s later, 1.3 s past their target.
SHARED_END_S = 0.25

# Seconds to evaluate ``n_new`` prompt tokens of a sequence holding ``n_cached`` tokens before them
# while the other sequences hold ``n_others`` KV cells (the cost model's ``predict``).
Cost = Callable[[int, int, int], float]


@dataclass(frozen=True)
class Work:
    """What the scheduler sees of one request: its key, deadline (seconds
    on the engine's clock; ``math.inf`` for none), arrival, prompt tokens
    still to evaluate, answer tokens still to generate, and whether it is
    generating now or is background work; ``pieces``: stored passages it
    still splices in, each of which ends a step of its own; ``context``:
    the tokens its sequence holds before the prompt tokens still to
    evaluate (they attend over them)."""

    key: int
    deadline: float
    arrival: float
    to_prefill: int
    to_decode: int = 0
    generating: bool = False
    background: bool = False
    pieces: int = 0
    context: int = 0

    def priority(self) -> tuple[int, float, float]:
        """Sort key: foreground first, then earliest deadline, then arrival."""
        return (BACKGROUND if self.background else FOREGROUND, self.deadline, self.arrival)


@dataclass(frozen=True)
class Step:
    """One batch: the requests that decode a token, and the prompt tokens
    each prefilling request evaluates, in priority order."""

    decode: tuple[int, ...]
    prefill: tuple[tuple[int, int], ...]

    @property
    def tokens(self) -> int:
        """Tokens in the batch."""
        return len(self.decode) + sum(n for _, n in self.prefill)


def plan_step(active: Sequence[Work], *, busy_step_tokens: int, idle_step_tokens: int, n_batch: int,
              background_step_tokens: int = BACKGROUND_STEP_TOKENS) -> Step:
    """The next batch for the ``active`` requests (those holding a sequence).

    Prompt tokens get ``busy_step_tokens`` while others decode (so their streams
    keep moving), ``idle_step_tokens`` otherwise; the batch never exceeds
    ``n_batch``. Background prompts only get what no foreground prompt wants,
    at most ``background_step_tokens`` a step, and background answers (a summary being written) pause while a
    foreground prompt is evaluated: their decode steps would cut its prompt
    into slices of the busy step size, each a step of its own. A step in which a
    prompt with a deadline ends takes no prompt due more than
    ``SHARED_END_S`` after it.

    With one request decoding and two prefilling (deadlines 3.1 and 3), a
    step size of 4 and prompts of 3 tokens each:
    ``plan_step(...) -> Step(decode=(1,), prefill=((3, 3), (2, 1)))``
    """
    foreground_prompt = any(w.to_prefill > 0 and not w.generating and not w.background for w in active)
    decode = tuple(w.key for w in active if w.generating and not (w.background and foreground_prompt))
    room = min(busy_step_tokens if decode else idle_step_tokens, n_batch - len(decode))
    waiting = sorted((w for w in active if w.to_prefill > 0 and not w.generating), key=Work.priority)
    foreground_waiting = any(not w.background for w in waiting)
    prefill: list[tuple[int, int]] = []
    ends = math.inf  # the deadline of the first prompt that ends in this step
    for w in waiting:
        if room <= 0 or (w.background and foreground_waiting) or w.deadline > ends + SHARED_END_S:
            break
        n = min(w.to_prefill, room, background_step_tokens if w.background else room)
        prefill.append((w.key, n))
        room -= n
        if n == w.to_prefill and not w.background:
            ends = min(ends, w.deadline)
    return Step(decode, tuple(prefill))


def admission_order(waiting: Sequence[Work]) -> list[Work]:
    """Requests waiting for a sequence, in the order they get one; background
    work only when no foreground request waits."""
    ordered = sorted(waiting, key=Work.priority)
    if any(not w.background for w in ordered):
        ordered = [w for w in ordered if not w.background]
    return ordered


class MixedStep(NamedTuple):
    """A step that evaluated prompt tokens beside answer tokens, as it ran:
    its prompt pieces as ``(tokens, context)``, its answer tokens, the KV
    cells the sequences held, and its seconds."""

    prefill: tuple[tuple[int, int], ...]
    decodes: int
    cells: int
    seconds: float


def others_cells(cells: int, context: int) -> int:
    """Of ``cells`` KV cells held in all, those of the other sequences
    beside one holding ``context`` tokens (the shared system prompt counts
    once, in its context)."""
    return max(cells - context, 0)


def prefill_seconds(pieces: Sequence[tuple[int, int]], cells: int, cost: Cost) -> float:
    """Seconds to evaluate these ``(tokens, context)`` prompt pieces while
    the sequences hold ``cells`` KV cells: each piece attends over its own
    context and over the cells of the others, which llama.cpp masks but
    still visits."""
    return sum(cost(n, context, others_cells(cells, context)) for n, context in pieces if n > 0)


@dataclass(frozen=True)
class Load:
    """The engine as a new request finds it: the requests holding a
    sequence, those waiting for one, how many sequences requests may hold,
    the step sizes (prompt tokens a step takes), and the measured seconds of a decode-only step by
    batch size."""

    active: tuple[Work, ...] = ()
    waiting: tuple[Work, ...] = ()
    slots: int = 1
    busy_step_tokens: int = BUSY_STEP_TOKENS
    idle_step_tokens: int = 512
    n_batch: int = 512
    decode_steps: tuple[tuple[int, float], ...] = ()  # (batch size, seconds), measured
    in_flight: "Step | None" = None  # the step running now, never interrupted (``active`` is as it was before it)
    in_flight_s: float = 0.0  # how long it has run
    mixed_steps: tuple[MixedStep, ...] = ()  # recent steps that held prompt and answer tokens
    cells: int = 0  # KV cells the sequences hold now, the shared system prompt once

    def decode_s(self, batch: int, seconds_per_token: float) -> float:
        """Seconds of a decode step with ``batch`` sequences: the nearest size
        measured (scaled up for a larger batch), else ``batch`` prompt tokens' worth."""
        if batch <= 0:
            return 0.0
        if not self.decode_steps:
            return batch * seconds_per_token
        nearest, seconds = min(self.decode_steps, key=lambda m: abs(m[0] - batch))
        return seconds * (batch / nearest if nearest < batch else 1.0)


@dataclass(frozen=True)
class Wait:
    """What a new request meets: the seconds before its own prompt starts
    being evaluated, and how many sequences decode beside it then."""

    seconds: float = 0.0
    generating: int = 0


_NEW = -1  # the key of the request being estimated


def expected_wait(load: Load, deadline: float, cost: Cost, *, max_steps: int = 4096) -> Wait:
    """How long the work ahead of a new foreground request with ``deadline``
    keeps the engine before the request's own prompt tokens are evaluated
    (the prompts ahead of it in its first step included), found by running the scheduler's own rules forward: sequences
    given in :func:`admission_order` as they free, each step planned by
    :func:`plan_step` and costed by :func:`step_seconds` (each prompt at its
    context, beside the cells the sequences hold now). Requests are
    assumed to generate all the tokens they may, so the wait is an upper
    estimate; ``math.inf`` when it would never start (no sequence for requests)."""
    per_token = _per_token(cost)
    active = {w.key: w for w in load.active}
    queue = [*load.waiting, Work(_NEW, deadline, math.inf, 1, 1)]
    elapsed = 0.0
    running = load.in_flight
    if running is not None and running.tokens:
        # A step is never interrupted: a request due sooner than those in it (or background work, or
        # warming the passage store, which the load leaves out) still waits for the rest of it.
        elapsed += max(step_seconds(load, _pieces(running.prefill, active), len(running.decode), cost)
                       - load.in_flight_s, 0.0)
        _advance(active, Step(tuple(k for k in running.decode if k in active),
                              tuple((k, n) for k, n in running.prefill if k in active)), 1)
    for _ in range(max_steps):
        for w in admission_order(queue)[:max(load.slots - len(active), 0)]:
            active[w.key] = w
            queue.remove(w)
        step = _in_pieces(plan_step(list(active.values()), busy_step_tokens=load.busy_step_tokens,
                                    idle_step_tokens=load.idle_step_tokens, n_batch=load.n_batch), active)
        keys = [key for key, _ in step.prefill]
        if _NEW in keys:
            # Prompts ahead of it in its first step are evaluated with it: their tokens are its wait too.
            ahead = _pieces(step.prefill[:keys.index(_NEW)], active)
            if ahead:
                # The decodes beside them are its own slowdown, costed with its prompt: not counted here.
                elapsed += step_seconds(load, ahead, len(step.decode), cost) - load.decode_s(len(step.decode), per_token)
            return Wait(elapsed, len(step.decode))
        if not step.tokens:
            return Wait(math.inf, 0)
        # A step without prompt tokens repeats unchanged until the first of its requests finishes.
        repeat = 1 if step.prefill else min(active[k].to_decode for k in step.decode)
        elapsed += repeat * step_seconds(load, _pieces(step.prefill, active), len(step.decode), cost)
        _advance(active, step, repeat)
    return Wait(elapsed, 0)


def _pieces(prefill: Sequence[tuple[int, int]], active: dict[int, Work]) -> list[tuple[int, int]]:
    """A step's prompt tokens as ``(tokens, context)`` pieces (a key not
    among ``active``, warming the passage store, starts at no context)."""
    return [(n, active[k].context if k in active else 0) for k, n in prefill]


def _in_pieces(step: Step, active: dict[int, Work]) -> Step:
    """``step`` as the engine runs it: a prompt with stored passages ahead
    stops at the next one (taken here as an even share of what is left)."""
    def cap(key: int, n: int) -> int:
        w = active[key]
        return min(n, math.ceil(w.to_prefill / (w.pieces + 1))) if w.pieces else n

    return Step(step.decode, tuple((key, cap(key, n)) for key, n in step.prefill))


def _advance(active: dict[int, Work], step: Step, repeat: int) -> None:
    """``active`` after ``repeat`` runs of ``step``: decoders a token nearer
    their end, prompts evaluated, finished requests gone (their sequences free)."""
    for key in step.decode:
        w = active[key]
        active[key] = replace(w, to_decode=w.to_decode - repeat, context=w.context + repeat)
    for key, n in step.prefill:
        w = active[key]
        left = w.to_prefill - n
        # The step that evaluates a prompt's last token also samples its first answer token.
        active[key] = replace(w, to_prefill=left, generating=left == 0, pieces=max(w.pieces - 1, 0),
                              to_decode=w.to_decode - (1 if left == 0 else 0), context=w.context + n)
    for key in [k for k, w in active.items() if w.to_decode <= 0 and w.to_prefill <= 0]:
        del active[key]


def slowdown(load: Load, wait: Wait, cost: Cost, *, least: int = 3) -> float:
    """How much slower a new request's own prefill (as ``cost`` predicts
    it, at its context and beside the others' cells) runs for the decode
    steps of the ``wait.generating`` others interleaved with it; 1 when
    nothing else is generating. Measured where it can be: the median of
    recent steps that evaluated prompt tokens beside about as many decodes,
    each step's seconds over :func:`prefill_seconds` of its prompt pieces
    (at least ``least`` of them); else each step is taken as
    ``busy_step_tokens`` of its prompt tokens plus a decode-only step of the others."""
    busy = cost(load.busy_step_tokens, 0, 0)
    if not wait.generating or busy <= 0:
        return 1.0
    measured = _mixed_ratio(load, wait.generating, cost, least)
    if measured is not None:
        return max(measured, 1.0)
    return 1.0 + load.decode_s(wait.generating, busy / load.busy_step_tokens) / busy


def step_seconds(load: Load, pieces: Sequence[tuple[int, int]], decodes: int, cost: Cost, *, least: int = 3) -> float:
    """Seconds of one step of these ``(tokens, context)`` prompt pieces
    beside ``decodes`` answer tokens: their :func:`prefill_seconds` plus a
    decode step of that batch or, where recent steps held both, their
    prefill times the measured ratio (:func:`slowdown`'s) when that is
    more. Measured here (8 clients): beside 2-7 answers a step took 1.1-1.4
    times its prefill at its context, the decode step included."""
    base = prefill_seconds(pieces, load.cells, cost)
    plain = base + load.decode_s(decodes, _per_token(cost))
    measured = _mixed_ratio(load, decodes, cost, least) if base and decodes else None
    return max(plain, measured * base) if measured is not None else plain


def _mixed_ratio(load: Load, decodes: int, cost: Cost, least: int) -> float | None:
    """The median, over recent steps beside about ``decodes`` answer
    tokens, of a step's seconds over the prefill of its prompt pieces at
    their contexts (None with fewer than ``least`` of them)."""
    near = [m.seconds / base for m in load.mixed_steps
            if abs(m.decodes - decodes) <= 1 and (base := prefill_seconds(m.prefill, m.cells, cost)) > 0]
    return sorted(near)[len(near) // 2] if len(near) >= least else None


def _per_token(cost: Cost) -> float:
    """Seconds a prompt token takes, from a mid-sized prompt."""
    return cost(256, 0, 0) / 256


def step_beside(load: Load, wait: Wait, cost: Cost) -> float:
    """Seconds of one decode step of the requests that decode beside a new
    request's prefill: those generating when it starts, or every foreground
    request ahead if more (those still prefilling decode beside most of it)."""
    others = max(wait.generating, sum(1 for w in (*load.active, *load.waiting) if not w.background))
    return load.decode_s(others, cost(load.busy_step_tokens, 0, 0) / max(load.busy_step_tokens, 1))


@dataclass(frozen=True)
class Ahead:
    """What a new request meets on an engine now, as the engine reports it:
    seconds before its prompt starts being evaluated (``wait_s``), how
    much slower its prefill runs for others' decode steps interleaved with
    it (``slowdown``), the seconds of one such step (``step_s``: each
    stored passage spliced in ends a step of its own), and the KV cells the
    engine's sequences hold (``cells``: its prompt passes over them)."""

    wait_s: float = 0.0
    slowdown: float = 1.0
    step_s: float = 0.0
    cells: int = 0

    def others(self, n_cached: int) -> int:
        """Cells other sequences hold beside a prompt with ``n_cached`` of its tokens held."""
        return others_cells(self.cells, n_cached)


def ahead_of(load: Load, deadline: float | None, cost: Cost) -> Ahead:
    """What a request due at ``deadline`` (None: none) meets under
    ``load``, its prefill costed by ``cost``: the scheduler's rules run
    forward (:func:`expected_wait`, :func:`slowdown`, :func:`step_beside`)."""
    wait = expected_wait(load, deadline if deadline is not None else math.inf, cost)
    return Ahead(wait.seconds, slowdown(load, wait, cost), step_beside(load, wait, cost), load.cells)


class StepStats:
    """What the loop's steps did: counts for reports, the step running now,
    and the seconds a decode-only step of each batch size takes (a moving
    average, which :class:`Load` uses to predict decode time under load)."""

    def __init__(self, mixed: int = 32) -> None:
        # steps_not_run: begun but never counted: refused (no room in the KV cache) or failed.
        self.counters = {"steps": 0, "decode_steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "steps_not_run": 0}
        self._step_s: dict[int, float] = {}
        self._running: tuple[Step, float] | None = None  # the step running now, and when it began
        self._mixed: deque[MixedStep] = deque(maxlen=mixed)
        self._prompt_rate: float | None = None  # prompt tokens a second in steps of many beside decodes, those included

    def begin(self, step: Step, now: float) -> None:
        """``step`` starts at ``now`` (requests' work, background work or warming alike)."""
        self._running = (step, now)

    def abandon(self) -> None:
        """The step begun did not run, or failed before it was counted: it is
        no longer in flight, and is counted as not run. Nothing happens when none is in flight
        (it was counted already), so the loop may call it whatever happened."""
        if self._running is not None:
            self._running = None
            self.counters["steps_not_run"] += 1

    def in_flight(self, now: float) -> tuple[Step | None, float]:
        """The step running at ``now`` (None when none) and how long it has run."""
        running = self._running
        return (None, 0.0) if running is None else (running[0], max(now - running[1], 0.0))

    def mixed_steps(self) -> tuple[MixedStep, ...]:
        """Recent steps that held both prompt and answer tokens, oldest first."""
        return tuple(self._mixed)

    def count(self, decoded: int, prefill: Sequence[tuple[int, int]], seconds: float, cells: int = 0) -> None:
        """One step of ``decoded`` answer tokens and the ``(tokens, context)``
        prompt pieces ``prefill``, while the sequences held ``cells`` KV cells."""
        self._running = None
        prefilled = sum(n for n, _ in prefill)
        if decoded and prefilled:
            self._mixed.append(MixedStep(tuple(prefill), decoded, cells, seconds))
        if decoded and prefilled >= RATE_MIN_TOKENS and seconds > 0:  # as the step sizes are spent: beside decodes
            rate = prefilled / seconds
            self._prompt_rate = rate if self._prompt_rate is None else 0.8 * self._prompt_rate + 0.2 * rate
        c = self.counters
        c["steps"] += 1
        c["prefill_tokens"] += prefilled
        if decoded:
            c["decode_steps"] += 1
            c["decode_tokens"] += decoded
            if not prefilled:
                before = self._step_s.get(decoded)
                self._step_s[decoded] = seconds if before is None else 0.8 * before + 0.2 * seconds

    def step_tokens(self, seconds: float, least: int, most: int) -> int:
        """Prompt tokens a step of ``seconds`` holds at the rate measured in
        steps of at least ``RATE_MIN_TOKENS`` prompt tokens beside answer
        tokens (a prompt-only step runs faster), never fewer than ``least``
        nor more than ``most``; ``least`` until a step was measured.

        ``StepStats().step_tokens(0.85, 256, 512) == 256``
        """
        rate = self._prompt_rate
        wanted = least if rate is None else int(seconds * rate)
        return max(least, min(wanted, most))

    def decode_steps(self) -> tuple[tuple[int, float], ...]:
        """(batch size, seconds) for each decode-only batch size seen."""
        return tuple(self._step_s.items())
