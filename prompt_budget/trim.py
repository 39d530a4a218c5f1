"""Trimming a passage to a token budget at a sentence boundary.

Does not: count tokens itself (the caller passes the model's counter).
"""

from __future__ import annotations

import re
from typing import Callable

_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+|\n\s*\n")


def sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence of ``text``, in order, ending with
    ``len(text)``: ``sentence_ends("A b. C d.") -> [4, 9]``."""
    ends = [m.start() for m in _SENTENCE_END.finditer(text) if m.start() > 0]
    if not ends or ends[-1] != len(text.rstrip()):
        ends.append(len(text.rstrip()))
    return ends


def trim_to_tokens(
    text: str, max_tokens: int, count_tokens: Callable[[str], int], min_fill: float = 0.85
) -> str:
    """The longest run of whole sentences from the start of ``text`` that
    ``count_tokens`` puts at no more than ``max_tokens``. When whole
    sentences would use less than ``min_fill`` of the budget (a heading
    followed by one long sentence, a code block), the longest run of whole
    words is taken instead ("" if not even one word fits)."""
    if count_tokens(text) <= max_tokens:
        return text
    ends = sentence_ends(text)
    best = _longest_fitting([text[:e] for e in ends], max_tokens, count_tokens)
    if best and count_tokens(best) >= min_fill * max_tokens:
        return best
    words = [m.end() for m in re.finditer(r"\S+", text)]
    by_words = _longest_fitting([text[:e] for e in words], max_tokens, count_tokens)
    return by_words if len(by_words) > len(best) else best


def _longest_fitting(prefixes: list[str], max_tokens: int, count_tokens: Callable[[str], int]) -> str:
    # Token counts grow with the prefix: bisect for the last that fits.
    lo, hi, best = 0, len(prefixes) - 1, ""
    while lo <= hi:
        mid = (lo + hi) // 2
        if count_tokens(prefixes[mid]) <= max_tokens:
            best, lo = prefixes[mid], mid + 1
        else:
            hi = mid - 1
    return best
