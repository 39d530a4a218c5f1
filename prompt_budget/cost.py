"""Predicting prefill time from measured samples.

A linear model ``t = a + b * n_new`` of prefill seconds for ``n_new``
uncached prompt tokens, refitted by least squares on the most recent
samples this process measured. Until two distinct lengths have been
measured it predicts from a prior rate.

Does not: model decode, batching, or the attention term over a long
cached context (a later refinement), and does not measure anything itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Prefill rate measured on the development machine (SmolLM2-135M Q4_1,
# 2 threads; DESIGN.md), used only before any sample of this machine exists.
PRIOR_TOKENS_PER_S = 200.0


@dataclass(frozen=True)
class PrefillSample:
    """One measured prefill: ``n_new`` tokens on top of ``n_cached``."""

    n_cached: int
    n_new: int
    seconds: float


class PrefillCostModel:
    """Prefill seconds as a linear function of uncached tokens."""

    def __init__(self, window: int = 64, prior_tokens_per_s: float = PRIOR_TOKENS_PER_S) -> None:
        self._samples: deque[PrefillSample] = deque(maxlen=window)
        self.a = 0.0
        self.b = 1.0 / prior_tokens_per_s

    @property
    def samples(self) -> tuple[PrefillSample, ...]:
        """The samples the current fit is made from, oldest first."""
        return tuple(self._samples)

    def predict(self, n_new: int, n_cached: int = 0) -> float:
        """Predicted prefill seconds for ``n_new`` uncached tokens (never negative)."""
        if n_new <= 0:
            return 0.0
        return max(self.a + self.b * n_new, 0.0)

    def observe(self, sample: PrefillSample) -> None:
        """Add a measurement and refit."""
        if sample.n_new <= 0 or sample.seconds <= 0:
            return
        self._samples.append(sample)
        self._fit()

    def _fit(self) -> None:
        xs = [s.n_new for s in self._samples]
        ys = [s.seconds for s in self._samples]
        n = len(xs)
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        var_x = sum((x - mean_x) ** 2 for x in xs)
        if var_x == 0:
            # One length only: keep the line through the origin and the mean.
            self.a, self.b = 0.0, mean_y / mean_x
            return
        b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var_x
        if b <= 0:
            self.a, self.b = 0.0, mean_y / mean_x
            return
        self.a, self.b = mean_y - b * mean_x, b
