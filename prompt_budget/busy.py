"""Telling the answers measured in a busy period (another process on the
cores) from the machine's own error, so that the margin and the fit can
forget them once the machine is quiet again.

Does not: keep ratios (``margin``) or samples (``cost``): it flags them.
"""

from __future__ import annotations

from typing import Sequence

from .recent import quantile

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
