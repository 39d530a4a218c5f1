"""Pure functions on token arrays, shared by every engine and the layer above.

Does not: tokenize (a backend does that with its model's own tokenizer).
"""

from __future__ import annotations

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
