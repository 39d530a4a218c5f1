"""Cutting passages to their best window when the budget is tight.

When the TTFT target leaves room for fewer than ``FOCUS_PASSAGES`` whole
chunks, whole chunks would put one or two sources into the prompt, and the
answer may sit in the third. Cutting each candidate to the run of sentences
that best matches the question, ``room / FOCUS_PASSAGES`` tokens long, puts
more sources into the same tokens: measured on the Python docs, the share of
questions whose prompt held an answering file at a 2 s target rose from
0.85 to the figure in the README's `rag bench peer` table.

Does not: count tokens or score sentences itself (the caller passes both).
"""

from __future__ import annotations

from typing import Sequence

FOCUS_PASSAGES = 3  # sources the budget should have room for before chunks are cut
MIN_FOCUS_TOKENS = 64  # below this a window loses its context


def focus_cap(room_tokens: int, chunk_tokens: int, passages: int = FOCUS_PASSAGES) -> int | None:
    """The most tokens a passage may keep when ``room_tokens`` are left for
    passages of up to ``chunk_tokens``; None when whole chunks fit
    ``passages`` times (or the room is too small to cut usefully).

    ``focus_cap(270, 190) -> 90``; ``focus_cap(2000, 190) -> None``
    """
    if room_tokens >= passages * chunk_tokens:
        return None
    cap = room_tokens // passages
    if cap < MIN_FOCUS_TOKENS:
        return None if room_tokens < 2 * MIN_FOCUS_TOKENS else room_tokens // 2
    return cap


def best_window(scores: Sequence[float], sizes: Sequence[int], max_tokens: int) -> tuple[int, int]:
    """``(start, end)`` of the contiguous run of units whose ``sizes`` sum to
    at most ``max_tokens`` and whose ``scores`` sum highest; among equals,
    the earliest, then the longest. ``(0, 0)`` if no unit fits alone.

    ``best_window([0, 1, 3, 0], [5, 5, 5, 5], 10) -> (1, 3)``
    """
    best = (0, 0)
    best_key = (-1.0, 0)
    start, total, score = 0, 0, 0.0
    for end in range(len(sizes)):
        total += sizes[end]
        score += scores[end]
        while total > max_tokens and start <= end:
            total -= sizes[start]
            score -= scores[start]
            start += 1
        if start <= end:
            key = (round(score, 9), end + 1 - start)
            if key > best_key:
                best, best_key = (start, end + 1), key
    return best
