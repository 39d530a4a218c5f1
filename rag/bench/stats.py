"""Figures the benchmarks share: quantiles that tolerate empty lists, and
means.

Does not: measure anything.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from prompt_budget.cost import quantile

__all__ = ["mean", "percentile", "quantile"]


def percentile(values: Sequence[float], q: float, digits: int = 3) -> float | None:
    """The ``q`` quantile of ``values`` rounded to ``digits``, None for no values.

    ``percentile([1, 2, 3, 4], 0.5) -> 2.5``
    """
    return round(quantile(values, q), digits) if values else None


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; 0.0 for no values."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0
