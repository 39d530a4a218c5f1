"""When the loop warms the passage store: only while nothing else needs the
engine. A pure decision over the requests the loop holds; the loop carries
it out (cancels, gives back, queues).

Does not: evaluate or keep passages (``splicing``), or touch the context.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from .requests import Active, Request


class WarmingTurn(NamedTuple):
    """What this turn does about warming."""

    stop: list[Active]  # warming requests holding a sequence that give way (cancelled, their passages queued again)
    unqueue: list[Request]  # warming requests waiting for a sequence that give way
    start: bool  # whether a new warming request may be queued (nothing else held or waiting)


def warming_turn(active: Iterable[Active], waiting: Sequence[Request]) -> WarmingTurn:
    """Warming gives way to any other request, running or waiting, and
    starts only when the engine holds and awaits nothing at all."""
    active = list(active)
    if any(not r.idle for r in waiting) or any(not a.req.idle for a in active):
        return WarmingTurn([a for a in active if a.req.idle], [r for r in waiting if r.idle], False)
    return WarmingTurn([], [], not active and not waiting)
