"""Figures the benchmarks share: quantiles that tolerate empty lists,
means, and bootstrap intervals.

Does not: measure anything.
"""

from __future__ import annotations

import random
from typing import Callable, Iterable, Sequence

from prompt_budget.recent import quantile

__all__ = ["bootstrap_interval", "mean", "percentile", "quantile"]


def percentile(values: Sequence[float], q: float, digits: int = 3) -> float | None:
    """The ``q`` quantile of ``values`` rounded to ``digits``, None for no values.

    ``percentile([1, 2, 3, 4], 0.5) -> 2.5``
    """
    return round(quantile(values, q), digits) if values else None


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; 0.0 for no values."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def bootstrap_interval(values: Sequence[float], statistic: Callable[[Sequence[float]], float], *,
                       level: float = 0.95, resamples: int = 2000, seed: int = 0, digits: int = 3) -> list[float] | None:
    """The percentile bootstrap interval of ``statistic(values)``: the
    statistic of ``resamples`` resamples (with replacement, same size),
    seeded so a run repeats; ``[low, high]`` rounded, None for no values.

    ``bootstrap_interval([1, 1, 1], mean) -> [1.0, 1.0]``
    """
    values = list(values)
    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return [round(quantile(stats, tail), digits), round(quantile(stats, 1 - tail), digits)]
