"""Predicting prefill time from measured samples.

Prefill seconds for ``n_new`` uncached tokens evaluated on top of
``n_cached`` tokens already in the KV cache, while other sequences hold
``n_others`` cells of it, in one of three forms:

    linear     t = a + b·n_new
    attention  t = a + b·n_new + c·n_new·(n_cached + n_new/2)
    occupancy  t = a + b·n_new + c·n_new·(n_cached + n_new/2) + d·n_new·n_others

The attention form adds the work of every new token attending to the whole
context before it (``n_cached + n_new/2`` on average). The occupancy form
adds what the other sequences' cells cost each new token: with one KV cache
for all sequences, llama.cpp's attention runs over every cell up to the
highest in use, the others' masked (cheaper than attending, not free: in a
run of three conversations, 0.17 µs a token per other cell against 1.0 µs
per cell attended). All are fitted by
least squares on relative error (so a 50 ms prefill counts as much as a 5 s
one), with outliers beyond a few median absolute deviations dropped, and
report their own mean absolute percentage error (MAPE).

Does not: model decode, batching, or queueing; measure anything itself.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

# Prefill rate measured on the development machine (SmolLM2-135M Q4_1,
# 2 threads), used only before any sample of this machine exists.
PRIOR_TOKENS_PER_S = 200.0
# Reading back a stored passage's KV: about 20 ms for 945 tokens of
# SmolLM2-135M from a snapshot here; used until this machine has spliced one.
PRIOR_SPLICE_S_PER_TOKEN = 25e-6
FORMS = ("linear", "attention", "occupancy")
# How far past the target an answer may start before the budget counts as missed: the margin is
# planned so that 95 % of answers start within this multiple of the target (issue 24). Held to
# the target itself, the margin must cover this machine's rare 20-30 % slow prefills, and the
# median answer then starts at three quarters of the target: a quarter of the budget unused.
TARGET_TOLERANCE = 1.10
# The share of prompts the margin lets start past that tolerance: 2 %, not 5 %. Planned at the 95th
# percentile, a run's own p95 lands on the tolerance itself and passes it in about half the runs; a
# run of 30 conversation turns keeps its p95 within the tolerance only with at most one turn over.
SAFETY_QUANTILE = 0.98
# Prompts are alike in their error when their cached contexts are within this factor of each other
# (below CONTEXT_FLOOR tokens every context counts as short): a question that follows a long cached
# conversation leans on the attention and occupancy terms and runs further from its prediction
# (measured: ratio q95 1.13-1.26 for conversation turns, 1.0-1.1 for fresh questions) than a fresh one.
CONTEXT_LIKENESS = 2.0
CONTEXT_FLOOR = 32
UNKNOWN_CONTEXT = -1  # ratios saved by profiles from before contexts were kept
# A busy period (another process on the cores) is a stretch of answers whose prediction error is far
# above the machine's own: measured (issue 37, 2 cores) error p50 5 % on a clean profile, 18 % beside
# a CPU-bound neighbour on one core, 3 % once quiet again. Stretches of BUSY_STRETCH ratios are
# compared by their spread (median distance from their median: a rare slow prefill is the machine's
# own, and a prediction still catching up runs evenly off); one is busy when its spread is over
# BUSY_FACTOR times that of the reference and BUSY_EXCESS more, the reference itself quiet (spread
# at most QUIET_ERROR): the latest QUIET_STRETCHES stretches in a running process, the quietest one
# in a saved profile. Chosen on synthetic runs (tests/test_cost_model.py's: quiet ±4 % or ±10 % with
# one prefill in 25 a quarter slow, busy 0-75 % or 0-30 % slow), not measured on this machine: with
# them the plan was back within 16-20 quiet answers; a quiet ±4 % machine never forgot anything in
# 900 answers (±10 %: 14 forgettings); a busy one forgot its busy stretches while still busy in
# 1.4-3.7 % of answers (the margin then no less than its default until half a window follows).
BUSY_STRETCH = 8
BUSY_FACTOR = 2.0
BUSY_EXCESS = 0.05
QUIET_ERROR = 0.08
QUIET_STRETCHES = 2


def alike(n_cached: int, other: int) -> bool:
    """Whether prompts on ``n_cached`` and ``other`` cached tokens are alike
    enough to share their prediction error: ``alike(1000, 1900) -> True``,
    ``alike(66, 1000) -> False``; an unknown context is like none."""
    if n_cached < 0 or other < 0:
        return False
    a, b = max(n_cached, CONTEXT_FLOOR), max(other, CONTEXT_FLOOR)
    return max(a, b) <= CONTEXT_LIKENESS * min(a, b)


@dataclass(frozen=True)
class PrefillSample:
    """One measured prefill: ``n_new`` tokens on top of ``n_cached``, while
    other sequences held ``n_others`` cells."""

    n_cached: int
    n_new: int
    seconds: float
    n_others: int = 0


def features(form: str, n_new: float, n_cached: float, n_others: float = 0) -> list[float]:
    """The regressors of ``form``: ``features("linear", 10, 5) -> [1, 10]``."""
    if form == "linear":
        return [1.0, float(n_new)]
    if form == "attention":
        return [1.0, float(n_new), float(n_new) * (n_cached + n_new / 2.0)]
    if form == "occupancy":
        return [1.0, float(n_new), float(n_new) * (n_cached + n_new / 2.0), float(n_new) * n_others]
    raise ValueError(f"unknown cost model form {form!r}; expected one of {FORMS}")


@dataclass(frozen=True)
class Fit:
    """Fitted coefficients of one form, with the fit's error on its samples."""

    form: str
    coef: tuple[float, ...]
    mape: float
    samples: int
    outliers: int = 0

    def predict(self, n_new: int, n_cached: int = 0, n_others: int = 0) -> float:
        """Predicted prefill seconds (0 for no new tokens, never negative)."""
        if n_new <= 0:
            return 0.0
        return max(sum(c * x for c, x in zip(self.coef, features(self.form, n_new, n_cached, n_others))), 0.0)


def prior_fit(tokens_per_s: float = PRIOR_TOKENS_PER_S) -> Fit:
    """A linear fit through the origin at a given rate, for before any sample."""
    return Fit("linear", (0.0, 1.0 / tokens_per_s), math.nan, 0)


def _solve(rows: list[list[float]], ys: list[float]) -> list[float]:
    # Weighted least squares on relative error: divide each row by its y.
    import numpy as np

    a = np.array([[x / y for x in row] for row, y in zip(rows, ys)])
    b = np.ones(len(ys))
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    return [float(c) for c in coef]


def _mape(form: str, coef: Sequence[float], samples: Sequence[PrefillSample]) -> float:
    fit = Fit(form, tuple(coef), 0.0, len(samples))
    errors = [abs(fit.predict(s.n_new, s.n_cached, s.n_others) - s.seconds) / s.seconds for s in samples]
    return sum(errors) / len(errors) if errors else math.nan


def fit_samples(samples: Sequence[PrefillSample], form: str = "attention", *, outlier_mads: float = 4.0) -> Fit:
    """Least-squares fit of ``form`` to ``samples`` (relative error), refitted
    once without the samples whose relative residual is more than
    ``outlier_mads`` median absolute deviations from the median.

    Raises ValueError when there are fewer usable samples than coefficients.
    """
    usable = [s for s in samples if s.n_new > 0 and s.seconds > 0]
    k = len(features(form, 1, 0))
    if len(usable) < k:
        raise ValueError(f"{len(usable)} samples cannot fit the {form} form's {k} coefficients")
    coef = _solve([features(form, s.n_new, s.n_cached, s.n_others) for s in usable], [s.seconds for s in usable])
    fit = Fit(form, tuple(coef), 0.0, len(usable))
    residuals = [(s.seconds - fit.predict(s.n_new, s.n_cached, s.n_others)) / s.seconds for s in usable]
    median = sorted(residuals)[len(residuals) // 2]
    mad = sorted(abs(r - median) for r in residuals)[len(residuals) // 2] or 1e-9
    kept = [s for s, r in zip(usable, residuals) if abs(r - median) <= outlier_mads * max(mad, 0.01)]
    if len(kept) >= k and len(kept) < len(usable):
        coef = _solve([features(form, s.n_new, s.n_cached, s.n_others) for s in kept], [s.seconds for s in kept])
    return Fit(form, tuple(coef), _mape(form, coef, kept), len(kept), len(usable) - len(kept))


def plausible(fit: Fit) -> bool:
    """Whether ``fit`` can plan a budget: each new token costs time (and the
    attention term does not make long prompts cheaper). A fit that predicts
    prompts as free or falling would overshoot the target many times over;
    calibration, online refits and saved profiles all keep to this rule."""
    return fit.coef[1] > 0 and all(c >= 0 for c in fit.coef[2:])


def best_fit(samples: Sequence[PrefillSample]) -> tuple[Fit, dict[str, Fit]]:
    """The form the samples support best, and the fit of every form tried.

    Forms are tried simplest first; a richer one is kept only if the term it
    adds is positive, it can plan (:func:`plausible`) and it lowers the MAPE
    of the best so far. Samples that all had the cache to themselves cannot
    show the occupancy term, so the attention form stays.
    """
    fits: dict[str, Fit] = {}
    shared = any(s.n_others for s in samples)
    for form in FORMS:
        if form == "occupancy" and not shared:
            continue  # its term is zero on every sample: nothing to fit, nothing to show (rag calibrate)
        try:
            fits[form] = fit_samples(samples, form)
        except ValueError:
            continue
    if not fits:
        raise ValueError("no samples to fit")
    best = None
    for fit in fits.values():  # simplest first
        if best is None or (fit.coef[-1] > 0 and plausible(fit) and fit.mape < best.mape):
            best = fit
    return best, fits


def _spread(ratios: Sequence[float]) -> float:
    # The median distance of ratios from their median: how unevenly the machine ran (a rare slow
    # prefill is its own; a prediction still catching up with a change runs evenly off, not unevenly).
    middle = quantile(ratios, 0.5)
    return quantile([abs(r - middle) for r in ratios], 0.5)


def busy(ratios: Sequence[float], *, reference: str = "latest") -> list[bool]:
    """For each of ``ratios`` (measured ÷ predicted, oldest first), whether
    it was measured in a busy period: one or more stretches of
    ``BUSY_STRETCH`` (counted back from the newest; a shorter oldest rest
    joins the next) whose median error ``|ratio - 1|`` exceeds both
    ``BUSY_FACTOR`` times and ``BUSY_EXCESS`` more than that of the
    reference stretch, the ``"latest"`` (how the machine runs now: a busy
    period is recognised once it is over) or the ``"quietest"`` (how it
    runs when nothing else does). None is busy with fewer than two
    stretches, or where the reference is not quiet (``QUIET_ERROR``).

    The period runs from one stretch before its first busy one (stretches
    are counted, not found: its first ratios may share a stretch with quiet
    ones) to its last busy one, or with the latest reference to the latest
    stretch (the answers between were predicted from the busy hour); a
    stretch within it that ran near the prediction is still of that hour.
    """
    if reference not in ("latest", "quietest"):
        raise ValueError(f"unknown reference {reference!r}; expected 'latest' or 'quietest'")
    flags = [False] * len(ratios)
    stretches = [(max(end - BUSY_STRETCH, 0), end) for end in range(len(ratios), 0, -BUSY_STRETCH)]
    if len(stretches) > 1 and stretches[-1][1] - stretches[-1][0] < BUSY_STRETCH:
        rest, _ = stretches.pop()
        stretches[-1] = (rest, stretches[-1][1])
    if len(stretches) < 2:
        return flags
    errors = [_spread(ratios[a:b]) for a, b in stretches]
    # Now is the latest QUIET_STRETCHES stretches: a neighbour's load comes and goes, and one stretch
    # of it may run near the prediction by chance.
    now = QUIET_STRETCHES if reference == "latest" else 0
    if len(stretches) <= max(now, 1):
        return flags
    ref = max(errors[:now]) if reference == "latest" else min(errors)
    if ref > QUIET_ERROR:
        return flags
    limit = max(BUSY_FACTOR * ref, ref + BUSY_EXCESS)
    spans = [(a, b) for (a, b), error in list(zip(stretches, errors))[now:] if error > limit]
    if spans:
        start = max(min(a for a, _ in spans) - BUSY_STRETCH, 0)
        end = stretches[now - 1][0] if reference == "latest" else max(b for _, b in spans)
        flags[start:end] = [True] * (end - start)
    return flags


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation:
    ``quantile([1, 2, 3, 4], 0.5) -> 2.5``."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class PrefillCostModel:
    """A prefill cost model that keeps learning from what it measures.

    It keeps a bounded window of recent samples and refits on each new one,
    and tracks the ratio of measured to predicted time of each prediction it
    made *before* seeing the measurement, so callers can plan against a high
    quantile of its real error rather than its mean.

    Thread safe: a server's requests predict while finished ones refit it.
    """

    def __init__(
        self,
        fit: Fit | None = None,
        samples: Iterable[PrefillSample] = (),
        *,
        anchors: Iterable[PrefillSample] = (),
        window: int = 128,
        ratios: Iterable[float] = (),
        ratio_contexts: Iterable[int] = (),
        ratio_window: int = 128,
        recent: int = 64,
        overheads: Iterable[float] = (),
        prior_tokens_per_s: float = PRIOR_TOKENS_PER_S,
        splice_loads: Iterable[float] = (),
        splice_pieces: Iterable[float] = (),
        sample_ratios: Iterable[float | None] = (),
    ) -> None:
        # Calibration samples stay as anchors, so the fit still spans short
        # and long prompts when recent requests all have similar lengths.
        self.anchors: tuple[PrefillSample, ...] = tuple(anchors)
        self._samples: deque[PrefillSample] = deque(samples, maxlen=window)
        # Each sample's ratio (None: not known), so that the samples of a busy period can be told.
        known = list(sample_ratios)[-len(self._samples):] if self._samples else []
        self._sample_ratios: deque[float | None] = deque(
            [None] * (len(self._samples) - len(known)) + known, maxlen=window)
        # Each ratio with the cached context of its prompt, so that a margin is drawn from prompts like
        # the one planned; a window twice ``recent`` holds enough of each kind where kinds alternate.
        ratios = list(ratios)[-ratio_window:]
        contexts = list(ratio_contexts)[-len(ratios):] if ratios else []
        self._ratios: deque[float] = deque(ratios, maxlen=ratio_window)
        self._ratio_contexts: deque[int] = deque(
            [UNKNOWN_CONTEXT] * (len(ratios) - len(contexts)) + contexts, maxlen=ratio_window)
        self._recent = recent
        self._overheads: deque[float] = deque(overheads, maxlen=recent)
        # A spliced prompt costs the load of its stored cells (seconds per token) and, for each
        # stored passage, one more evaluation call: llama.cpp takes a sequence's tokens only right
        # after its last cell, so the prompt is evaluated in pieces between its passages.
        self._splice_loads: deque[float] = deque(splice_loads, maxlen=recent)
        self._splice_pieces: deque[float] = deque(splice_pieces, maxlen=recent)
        self.fit = fit or prior_fit(prior_tokens_per_s)
        self._lock = threading.RLock()
        self._forgot = False  # a busy period was forgotten (see ``safety_factor``)
        self._corrections: dict[int, float] = {}
        self._levels: dict[int, float] = {}
        self._update_corrections()

    @property
    def samples(self) -> tuple[PrefillSample, ...]:
        """The window of samples the current fit is made from, oldest first."""
        with self._lock:
            return tuple(self._samples)

    @property
    def sample_ratios(self) -> tuple[float | None, ...]:
        """The measured ÷ predicted ratio of each of :attr:`samples` (None
        where it was not known)."""
        with self._lock:
            return tuple(self._sample_ratios)

    def _busy_samples(self, reference: str = "latest") -> set[int]:
        # Where in the window the samples of busy periods are (see ``busy``); those of unknown ratio stay.
        known = [i for i, r in enumerate(self._sample_ratios) if r is not None]
        flags = busy([self._sample_ratios[i] for i in known], reference=reference)
        return {i for i, flag in zip(known, flags) if flag}

    def _without(self, reference: str) -> tuple[list[tuple[PrefillSample, float | None]], list[tuple[float, int]]]:
        # The samples (with their ratios) and the ratios (with their contexts) outside busy periods.
        dropped = self._busy_samples(reference)
        flags = busy(list(self._ratios), reference=reference)
        return ([p for i, p in enumerate(zip(self._samples, self._sample_ratios)) if i not in dropped],
                [p for p, flag in zip(zip(self._ratios, self._ratio_contexts), flags) if not flag])

    def _forget_busy(self) -> bool:
        """Forget a busy period once the latest answers are quiet again (its
        ratios and samples); whether there was one."""
        samples, ratios = self._without("latest")
        if len(samples) == len(self._samples) and len(ratios) == len(self._ratios):
            return False
        for window, kept in ((self._samples, [s for s, _ in samples]), (self._sample_ratios, [r for _, r in samples]),
                             (self._ratios, [r for r, _ in ratios]), (self._ratio_contexts, [c for _, c in ratios])):
            window.clear()
            window.extend(kept)
        self._forgot = True
        return True

    @property
    def ratios(self) -> tuple[float, ...]:
        """Measured ÷ predicted prefill of recent requests, oldest first."""
        with self._lock:
            return tuple(self._ratios)

    @property
    def ratio_contexts(self) -> tuple[int, ...]:
        """The cached tokens of each prompt in :attr:`ratios`
        (``UNKNOWN_CONTEXT`` where a saved profile did not say)."""
        with self._lock:
            return tuple(self._ratio_contexts)

    @property
    def overheads(self) -> tuple[float, ...]:
        """Recent seconds to first token spent outside prefill, oldest first."""
        with self._lock:
            return tuple(self._overheads)

    def overhead(self, default: float = 0.02) -> float:
        """The median of recent non-prefill seconds to first token."""
        with self._lock:
            return quantile(list(self._overheads), 0.5) if self._overheads else default

    def observe_overhead(self, seconds: float) -> None:
        """Record time to first token that prefill does not explain."""
        with self._lock:
            if seconds >= 0:
                self._overheads.append(seconds)

    @property
    def splice_loads(self) -> tuple[float, ...]:
        """Recent measured seconds per spliced token (load and placement), oldest first."""
        with self._lock:
            return tuple(self._splice_loads)

    @property
    def splice_pieces(self) -> tuple[float, ...]:
        """Recent measured seconds each spliced passage added to its prompt's evaluation, oldest first."""
        with self._lock:
            return tuple(self._splice_pieces)

    def splice_seconds(self, tokens: int, passages: int = 1) -> float:
        """Predicted seconds that ``tokens`` of ``passages`` stored passages
        add to a prompt in place of their prefill: loading and placing the
        tokens, and one more evaluation call per passage (the medians of
        recent splices; before any, a prior load rate and the fitted
        fixed cost of one evaluation call)."""
        if tokens <= 0 or passages <= 0:
            return 0.0
        with self._lock:
            load = quantile(list(self._splice_loads), 0.5) if self._splice_loads else PRIOR_SPLICE_S_PER_TOKEN
            if self._splice_pieces:
                piece = quantile(list(self._splice_pieces), 0.5)
            else:
                piece = max(self.fit.coef[0], 0.0) if self.fit.coef else 0.0
            return tokens * load + passages * piece

    def observe_splice(self, tokens: int, passages: int, load_s: float, extra_s: float) -> None:
        """Record a spliced prompt: ``load_s`` spent loading and placing
        ``tokens`` of ``passages`` stored passages, and ``extra_s`` its
        evaluation took beyond a plain prefill of its new tokens."""
        with self._lock:
            if tokens > 0 and load_s >= 0:
                self._splice_loads.append(load_s / tokens)
            if passages > 0:
                self._splice_pieces.append(max(extra_s, 0.0) / passages)

    @property
    def calibrated(self) -> bool:
        """Whether the fit comes from measurements rather than the prior."""
        return self.fit.samples > 0

    def predict(self, n_new: int, n_cached: int = 0, n_others: int = 0) -> float:
        """Predicted prefill seconds for ``n_new`` tokens on top of ``n_cached``
        while other sequences hold ``n_others`` cells: the fitted form, times
        what recent requests of about this size measured against it."""
        with self._lock:
            base = self.fit.predict(n_new, n_cached, n_others)
            return base * self.correction(n_new) * self.level(n_new) if base > 0 else base

    def correction(self, n_new: int) -> float:
        """The local measured ÷ fitted ratio at this prompt size (1 where
        too few recent requests were this size), interpolated between
        half-octave size bins: ``n_new`` of 90 and 128 may differ."""
        with self._lock:
            if not self._corrections or n_new <= 0:
                return 1.0
            x = 2.0 * math.log2(n_new)
            lo, hi = math.floor(x), math.ceil(x)
            r_lo, r_hi = self._corrections.get(lo), self._corrections.get(hi)
            if r_lo is None or r_hi is None:
                return r_lo or r_hi or 1.0
            return r_lo + (r_hi - r_lo) * (x - lo)

    def level(self, n_new: int) -> float:
        """How the last few requests of about this size ran against the
        size-corrected fit (1 with too few of them): recent drift."""
        with self._lock:
            if not self._levels or n_new <= 0:
                return 1.0
            return self._levels.get(round(2.0 * math.log2(n_new)), 1.0)

    def _update_corrections(self, min_samples: int = 8, recent: int = 128, level_samples: int = 8) -> None:
        # The form fits every size at once; what it gets wrong at one size
        # (small prompts run faster per token here than the form allows) is
        # learned from the recent requests of that size, within half an octave.
        settled = list(self._samples)
        bins: dict[int, list[float]] = {}
        for s in settled[-recent:]:
            base = self.fit.predict(s.n_new, s.n_cached, s.n_others)
            if base <= 0:
                continue
            k = 2.0 * math.log2(s.n_new)
            for b in (math.floor(k), math.ceil(k)):
                bins.setdefault(b, []).append(s.seconds / base)
        self._corrections = {
            b: min(max(quantile(v, 0.5), 0.6), 1.6) for b, v in bins.items() if len(v) >= min_samples
        }
        # A second, faster time scale: the size bins above span a long window
        # and lag when the whole machine speeds up or slows down (here by up
        # to 20 % between runs); the last few requests within an octave of a
        # size say how it runs now.
        latest: list[tuple[float, float]] = []
        for s in settled[-4 * level_samples:]:
            base = self.fit.predict(s.n_new, s.n_cached, s.n_others)
            if base > 0:
                latest.append((2.0 * math.log2(s.n_new), s.seconds / (base * self.correction(s.n_new))))
        self._levels = {}
        for b in sorted({round(k) + d for k, _ in latest for d in (-2, -1, 0, 1, 2)}):
            near = [r for k, r in latest if abs(k - b) <= 2][-level_samples:]
            if len(near) >= level_samples // 2:
                self._levels[b] = min(max(quantile(near, 0.5), 0.7), 1.4)

    def safety_factor(
        self, q: float = SAFETY_QUANTILE, min_ratios: int = 8, default: float = 1.15, stall: float = 2.0,
        cap: float = 1.5, tolerance: float = TARGET_TOLERANCE, *, n_cached: int | None = None,
    ) -> float:
        """The ``q`` quantile of recent measured ÷ predicted ratios over
        ``tolerance``, between 1 and ``cap``, or ``default`` until
        ``min_ratios`` have been seen: planned with it, a ``q`` share of
        prompts start within ``tolerance`` times the target, and none is
        planned past the central prediction.

        With ``n_cached``, the ratios are those of the recent prompts whose
        cached context was like it (:func:`alike`), or of all recent prompts
        while fewer than ``min_ratios`` were.

        Ratios beyond ``stall`` times the median are left out: they are the
        machine stalling (another process, a page fault), not the model's
        error, and a burst of them would otherwise starve every later prompt.
        Those of a busy period are forgotten once it is over (``observe``);
        until half a window of answers followed, the margin is no less than
        ``default``: the few since show the machine's usual error, not yet
        the rare slow prefill that a ``q`` quantile is for.
        """
        with self._lock:
            pairs = list(zip(self._ratios, self._ratio_contexts))
            ratios = [r for r, c in pairs if n_cached is not None and alike(c, n_cached)]
            if len(ratios) < min_ratios:
                ratios = [r for r, _ in pairs]
            ratios = ratios[-self._recent:]
            if len(ratios) < min_ratios:
                return default
            typical = quantile(ratios, 0.5)
            kept = [r for r in ratios if r <= stall * typical]
            margin = min(max(quantile(kept, q) / tolerance, 1.0), cap)
            if self._forgot and len(ratios) < self._recent // 2:
                margin = max(margin, default)
            return margin

    def observe(self, sample: PrefillSample, *, refit: bool = True) -> None:
        """Record a measurement: its ratio to the prediction made now, then
        add it to the window and refit the form in use."""
        with self._lock:
            if sample.n_new <= 0 or sample.seconds <= 0:
                return
            predicted = self.predict(sample.n_new, sample.n_cached, sample.n_others)
            ratio = sample.seconds / predicted if predicted > 0 and self.calibrated else None
            if ratio is not None:
                self._ratios.append(ratio)
                self._ratio_contexts.append(sample.n_cached)
            self._samples.append(sample)
            self._sample_ratios.append(ratio)
            if self._forget_busy() and not refit:
                self._update_corrections()
            if refit:
                self.refit()

    def refit(self) -> None:
        """Refit on the window in the form it supports best (the prior stays
        until the window holds enough distinct lengths; a fit that cannot
        plan is never taken)."""
        with self._lock:
            samples = list(self.anchors) + list(self._samples)
            if len({s.n_new for s in samples}) < 3:
                return
            # The form is chosen again each time: a quick calibration's anchors all start from an
            # empty cache, so they cannot show what attending to cached tokens costs, and a fit kept
            # linear for good then charged every prompt the cached context of the last few
            # (measured: a third too much for short-context prompts after long-context ones).
            try:
                chosen, _ = best_fit(samples)
            except ValueError:
                return
            if plausible(chosen):  # a richer form is chosen only if it can plan; a linear one that cannot: the last fit
                self.fit = chosen
            self._update_corrections()

    def settled(self) -> "PrefillCostModel":
        """This model without its busy periods, for a next process to start
        from: the ratios and samples of stretches far noisier than the
        quietest one (:func:`busy`) left out and the form refitted on the
        rest; itself where there were none. A machine busy all along keeps
        its figures (no stretch is quieter)."""
        with self._lock:
            pairs, ratios = self._without("quietest")
            dropped = len(pairs) < len(self._samples)
            if not dropped and len(ratios) == len(self._ratios):
                return self
            model = PrefillCostModel(
                self.fit, [s for s, _ in pairs], anchors=self.anchors, window=self._samples.maxlen or 128,
                ratios=[r for r, _ in ratios], ratio_contexts=[c for _, c in ratios],
                ratio_window=self._ratios.maxlen or 128, recent=self._recent, overheads=self._overheads,
                splice_loads=self._splice_loads, splice_pieces=self._splice_pieces,
                sample_ratios=[r for _, r in pairs],
            )
            model._forgot = True
            if dropped:
                model.refit()
            return model
