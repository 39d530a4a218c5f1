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

The margin planned on its error is ``margin``, busy periods are told by
``busy``, and what a prompt costs beyond its prefill is ``overhead``.

Does not: model decode, batching, or queueing; measure anything itself.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from .busy import busy
from .margin import Margin
from .overhead import PRIOR_OVERHEAD_S, Overheads
from .recent import quantile

# Prefill rate measured on the development machine (SmolLM2-135M Q4_1,
# 2 threads), used only before any sample of this machine exists.
PRIOR_TOKENS_PER_S = 200.0
FORMS = ("linear", "attention", "occupancy")
# How fast the machine runs now is the median of the last this many answers (measured ÷ fitted prefill):
# one slow answer never moves a median of three, and a lasting change of speed moves it within two.
# Chosen on tuning runs (issue 58: `rag bench ttft` over the 20 Python-docs dev questions at 1, 2 and
# 4 s beside a neighbour on one core, steady or every minute on and off, replayed in
# rag/bench/README.md): median prediction error 2.5-3.8 %, against 3.0-4.7 % for five, 4.0-6.1 % for
# eight (what the per-size drift of before used) and 2.3-8.4 % for exponential averages.
PACE_ANSWERS = 3
PACE_LIMITS = (0.25, 4.0)  # a pace outside these is a stall or a clock jump, not the machine's speed


def size_key(n_new: int, n_batch: int | None) -> tuple[int, float]:
    """What makes two prompts alike in how their prefill strays from the
    fitted form: how many batches of ``n_batch`` the engine evaluates them
    in, and their size in half-octaves (``2·log2``). One batch more costs
    more than its tokens (measured here: 539 new tokens took 2.1-2.2 s, 505
    took 1.6 s: the second call of 27 tokens 0.5 s), so 500 and 540 new
    tokens are not alike; without ``n_batch``, one batch of any size.

    ``size_key(540, 512) -> (2, 18.15...)``; ``size_key(500, 512) -> (1, 17.93...)``
    """
    x = 2.0 * math.log2(max(n_new, 1))
    if not n_batch or n_new <= n_batch:
        return 1, x
    return -(-n_new // n_batch), x


class PromptShape(NamedTuple):
    """What a prompt's prefill time depends on: ``n_new`` tokens evaluated
    on top of ``n_cached`` already in the KV cache, while other sequences
    hold ``n_others`` cells of it."""

    n_new: int
    n_cached: int = 0
    n_others: int = 0


@dataclass(frozen=True)
class PrefillSample:
    """One measured prefill: ``n_new`` tokens on top of ``n_cached``, while
    other sequences held ``n_others`` cells."""

    n_cached: int
    n_new: int
    seconds: float
    n_others: int = 0

    @property
    def shape(self) -> PromptShape:
        """The shape of the prompt measured."""
        return PromptShape(self.n_new, self.n_cached, self.n_others)


def features(form: str, shape: PromptShape) -> list[float]:
    """The regressors of ``form``: ``features("linear", PromptShape(10, 5)) -> [1, 10]``."""
    n_new, n_cached, n_others = shape
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

    def predict(self, shape: PromptShape) -> float:
        """Predicted prefill seconds of a prompt of ``shape`` (0 for no new tokens, never negative)."""
        if shape.n_new <= 0:
            return 0.0
        return max(sum(c * x for c, x in zip(self.coef, features(self.form, shape))), 0.0)


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
    errors = [abs(fit.predict(s.shape) - s.seconds) / s.seconds for s in samples]
    return sum(errors) / len(errors) if errors else math.nan


def fit_samples(samples: Sequence[PrefillSample], form: str = "attention", *, outlier_mads: float = 4.0) -> Fit:
    """Least-squares fit of ``form`` to ``samples`` (relative error), refitted
    once without the samples whose relative residual is more than
    ``outlier_mads`` median absolute deviations from the median.

    Raises ValueError when there are fewer usable samples than coefficients.
    """
    usable = [s for s in samples if s.n_new > 0 and s.seconds > 0]
    k = len(features(form, PromptShape(1)))
    if len(usable) < k:
        raise ValueError(f"{len(usable)} samples cannot fit the {form} form's {k} coefficients")
    coef = _solve([features(form, s.shape) for s in usable], [s.seconds for s in usable])
    fit = Fit(form, tuple(coef), 0.0, len(usable))
    residuals = [(s.seconds - fit.predict(s.shape)) / s.seconds for s in usable]
    median = sorted(residuals)[len(residuals) // 2]
    mad = sorted(abs(r - median) for r in residuals)[len(residuals) // 2] or 1e-9
    kept = [s for s, r in zip(usable, residuals) if abs(r - median) <= outlier_mads * max(mad, 0.01)]
    if len(kept) >= k and len(kept) < len(usable):
        coef = _solve([features(form, s.shape) for s in kept], [s.seconds for s in kept])
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


class PrefillCostModel:
    """A prefill cost model that keeps learning from what it measures.

    It keeps a bounded window of recent samples and refits on each new one,
    and tracks the ratio of measured to predicted time of each prediction it
    made *before* seeing the measurement (its :class:`Margin`), so callers
    can plan against a high quantile of its real error rather than its mean.

    Thread safe: a server's requests predict while finished ones refit it.
    """

    def __init__(
        self,
        fit: Fit | None = None,
        samples: Iterable[PrefillSample] = (),
        *,
        anchors: Iterable[PrefillSample] = (),
        window: int = 128,
        sample_ratios: Iterable[float | None] = (),
        margin: Margin | None = None,
        overheads: Overheads | None = None,
        prior_tokens_per_s: float = PRIOR_TOKENS_PER_S,
        n_batch: int | None = None,
    ) -> None:
        # Calibration samples stay as anchors, so the fit still spans short
        # and long prompts when recent requests all have similar lengths.
        self.anchors: tuple[PrefillSample, ...] = tuple(anchors)
        self._samples: deque[PrefillSample] = deque(samples, maxlen=window)
        # Each sample's ratio (None: not known), so that the samples of a busy period can be told.
        known = list(sample_ratios)[-len(self._samples):] if self._samples else []
        self._sample_ratios: deque[float | None] = deque(
            [None] * (len(self._samples) - len(known)) + known, maxlen=window)
        self.margin = margin or Margin()
        self.costs = overheads or Overheads()
        self.fit = fit or prior_fit(prior_tokens_per_s)
        self.n_batch = n_batch  # the engine's batch: prompts are evaluated in pieces of this many tokens
        self._lock = threading.RLock()
        self._corrections: dict[tuple[int, int], float] = {}  # (batches, half-octave) -> ratio
        self._pace = 1.0
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

    def _busy_samples(self, reference: str) -> set[int]:
        # Where in the window the samples of busy periods are (see ``busy``); those of unknown ratio stay.
        known = [i for i, r in enumerate(self._sample_ratios) if r is not None]
        flags = busy([self._sample_ratios[i] for i in known], reference=reference)
        return {i for i, flag in zip(known, flags) if flag}

    def _forget_busy(self) -> bool:
        """Forget a busy period once the latest answers are quiet again (its
        ratios and samples); whether there was one."""
        dropped = self._busy_samples("latest")
        forgot = self.margin.forget(busy(self.margin.ratios, reference="latest"))
        if dropped:
            kept = [p for i, p in enumerate(zip(self._samples, self._sample_ratios)) if i not in dropped]
            self._samples.clear()
            self._sample_ratios.clear()
            self._samples.extend(s for s, _ in kept)
            self._sample_ratios.extend(r for _, r in kept)
            self.margin.forgot = True
        return forgot or bool(dropped)

    @property
    def ratios(self) -> tuple[float, ...]:
        """Measured ÷ predicted prefill of recent requests, oldest first."""
        with self._lock:
            return self.margin.ratios

    @property
    def ratio_contexts(self) -> tuple[int, ...]:
        """The cached tokens of each prompt in :attr:`ratios`
        (``UNKNOWN_CONTEXT`` where a saved profile did not say)."""
        with self._lock:
            return self.margin.contexts

    @property
    def overheads(self) -> tuple[float, ...]:
        """Recent seconds to first token spent outside prefill, oldest first."""
        with self._lock:
            return self.costs.fixed.values

    def overhead(self, default: float = PRIOR_OVERHEAD_S) -> float:
        """The median of recent non-prefill seconds to first token."""
        with self._lock:
            return self.costs.overhead(default)

    def observe_overhead(self, seconds: float) -> None:
        """Record time to first token that prefill does not explain."""
        with self._lock:
            self.costs.observe_overhead(seconds)

    @property
    def splice_reads(self) -> tuple[float, ...]:
        """Recent measured seconds per spliced token (reading its KV and placing it), oldest first."""
        with self._lock:
            return self.costs.splice_reads.values

    @property
    def splice_pieces(self) -> tuple[float, ...]:
        """Recent measured seconds each spliced passage added to its prompt's evaluation, oldest first."""
        with self._lock:
            return self.costs.splice_pieces.values

    def splice_seconds(self, tokens: int, passages: int = 1) -> float:
        """Predicted seconds that ``tokens`` of ``passages`` stored passages
        add to a prompt in place of their prefill (see
        :meth:`Overheads.splice_seconds`; before any splice, one more
        evaluation call costs the fit's fixed term)."""
        with self._lock:
            call_s = max(self.fit.coef[0], 0.0) if self.fit.coef else 0.0
            return self.costs.splice_seconds(tokens, passages, call_s)

    def observe_splice(self, tokens: int, passages: int, read_s: float, extra_s: float) -> None:
        """Record a spliced prompt (see :meth:`Overheads.observe_splice`)."""
        with self._lock:
            self.costs.observe_splice(tokens, passages, read_s, extra_s)

    @property
    def calibrated(self) -> bool:
        """Whether the fit comes from measurements rather than the prior."""
        return self.fit.samples > 0

    def predict(self, shape: PromptShape) -> float:
        """Predicted prefill seconds of a prompt of ``shape``: the fitted
        form, times what recent requests of about this size measured
        against it."""
        with self._lock:
            base = self.fit.predict(shape)
            return base * self.correction(shape.n_new) * self._pace if base > 0 else base

    def prefill_s(self, n_new: int, n_cached: int = 0, n_others: int = 0) -> float:
        """:meth:`predict` as the function of token counts that the budgeter
        (``budgeter.CostFn``) and the engine's scheduler take: they know
        token counts, not this package's :class:`PromptShape`."""
        return self.predict(PromptShape(n_new, n_cached, n_others))

    def correction(self, n_new: int) -> float:
        """The local measured ÷ fitted ratio at this prompt size (1 where
        too few recent requests were this size), interpolated between
        half-octave size bins: ``n_new`` of 90 and 128 may differ. With the
        engine's batch size known, only prompts of as many batches share a
        bin (see :func:`size_key`)."""
        with self._lock:
            if not self._corrections or n_new <= 0:
                return 1.0
            batches, x = size_key(n_new, self.n_batch)
            lo, hi = math.floor(x), math.ceil(x)
            r_lo, r_hi = self._corrections.get((batches, lo)), self._corrections.get((batches, hi))
            if r_lo is None or r_hi is None:
                return r_lo or r_hi or 1.0
            return r_lo + (r_hi - r_lo) * (x - lo)

    @property
    def pace(self) -> float:
        """How fast the machine runs now: the median of the last
        :data:`PACE_ANSWERS` answers' measured ÷ size-corrected fitted
        prefill (1 before any; above 1 slower). One slow answer among
        them does not move it; a lasting change moves it within two."""
        with self._lock:
            return self._pace

    def _update_corrections(self, min_samples: int = 4, recent: int = 128) -> None:
        # The form fits every size at once; what it gets wrong at one size
        # (small prompts run faster per token here than the form allows; a
        # prompt one batch longer costs more than its tokens) is learned from
        # the recent requests of that size and batch count, within half an
        # octave, from four of them: with eight (before issue 58) a 2 s target
        # met the cost of a second batch 8 times before learning it, and the
        # pace, taking it for the machine slowing, swung between the two sizes.
        settled = list(self._samples)
        bins: dict[tuple[int, int], list[float]] = {}
        for s in settled[-recent:]:
            base = self.fit.predict(s.shape)
            if base <= 0:
                continue
            batches, k = size_key(s.n_new, self.n_batch)
            for b in (math.floor(k), math.ceil(k)):
                bins.setdefault((batches, b), []).append(s.seconds / base)
        self._corrections = {
            b: min(max(quantile(v, 0.5), 0.6), 1.6) for b, v in bins.items() if len(v) >= min_samples
        }
        # A second, faster time scale: how fast the machine runs now (issue 58). The size bins above span
        # a long window and lag when the whole machine speeds up or slows down (a neighbour takes a core
        # or lets it go: prefill here runs 1.8 times slower beside one); such a change slows every size
        # alike, so the pace is the median of the last PACE_ANSWERS answers of any size, measured
        # against the size-corrected fit.
        latest = []
        for s in settled[-PACE_ANSWERS:]:
            base = self.fit.predict(s.shape) * self.correction(s.n_new)
            if base > 0:
                latest.append(s.seconds / base)
        self._pace = min(max(quantile(latest, 0.5), PACE_LIMITS[0]), PACE_LIMITS[1]) if latest else 1.0

    def safety_factor(self, *args, **kwargs) -> float:
        """The margin to plan with (:meth:`Margin.factor`, which takes the
        quantile, tolerance and the prompt's ``n_cached``): the ``q``
        quantile of recent measured ÷ predicted ratios over the tolerance,
        between 1 and a cap, or a default until enough were seen. Those of a
        busy period are forgotten once it is over (``observe``).
        """
        with self._lock:
            return self.margin.factor(*args, **kwargs)

    def observe(self, sample: PrefillSample, *, refit: bool = True) -> None:
        """Record a measurement: its ratio to the prediction made now, then
        add it to the window and refit the form in use."""
        with self._lock:
            if sample.n_new <= 0 or sample.seconds <= 0:
                return
            predicted = self.predict(sample.shape)
            ratio = sample.seconds / predicted if predicted > 0 and self.calibrated else None
            if ratio is not None:
                self.margin.record(ratio, sample.n_cached)
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
        quietest one (:func:`~prompt_budget.busy.busy`) left out and the form
        refitted on the rest; itself where there were none. A machine busy
        all along keeps its figures (no stretch is quieter)."""
        with self._lock:
            dropped = self._busy_samples("quietest")
            flags = busy(self.margin.ratios, reference="quietest")
            if not dropped and not any(flags):
                return self
            pairs = [p for i, p in enumerate(zip(self._samples, self._sample_ratios)) if i not in dropped]
            margin = Margin(self.margin.ratios, self.margin.contexts, window=self.margin.window,
                            recent=self.margin.recent)
            margin.forget(flags)
            margin.forgot = True
            costs = self.costs
            model = PrefillCostModel(
                self.fit, [s for s, _ in pairs], anchors=self.anchors, window=self._samples.maxlen or 128,
                sample_ratios=[r for _, r in pairs], margin=margin, n_batch=self.n_batch,
                overheads=Overheads(costs.fixed.values, costs.splice_reads.values, costs.splice_pieces.values),
            )
            if dropped:
                model.refit()
            return model
