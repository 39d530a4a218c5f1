"""Quantiles, and a bounded window of recent measurements with its median.

Does not: know what the measurements are (seconds, ratios) or lock: the
model that owns a window guards it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation:
    ``quantile([1, 2, 3, 4], 0.5) -> 2.5``."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Recent:
    """The last ``size`` values recorded, oldest first."""

    def __init__(self, values: Iterable[float] = (), size: int = 64) -> None:
        self._values: deque[float] = deque(values, maxlen=size)

    def add(self, value: float) -> None:
        """Record ``value``, forgetting the oldest once the window is full."""
        self._values.append(value)

    def median(self, default: float) -> float:
        """The median of the window, or ``default`` while it is empty."""
        return quantile(list(self._values), 0.5) if self._values else default

    @property
    def values(self) -> tuple[float, ...]:
        """The window, oldest first."""
        return tuple(self._values)

    def __len__(self) -> int:
        return len(self._values)
