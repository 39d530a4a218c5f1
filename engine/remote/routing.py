"""Which engine of a pool serves a request: pure decisions, no I/O.

A request's prompt is cheap on the engine that already holds its longest
prefix in its KV cache (the session's earlier turns, the system prompt) and
expensive anywhere else, so ``affinity`` sends it there, unless that engine's
predicted first token under its current load misses the request's deadline
while another engine's does not; when no engine holds more of the prompt
than the others, it goes to the engine with the earliest predicted first
token. ``round_robin`` and ``least_loaded`` are the load balancer's usual
policies, kept to compare against (``rag bench serve --engines``).

The caller predicts each engine's first token (its cost profile, the wait
behind what it is serving: see ``engine.scheduler.expected_wait``) and
passes the views of the healthy engines only.

Does not: measure, predict, talk to engines or keep health.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

POLICIES = ("affinity", "round_robin", "least_loaded")


@dataclass(frozen=True)
class EngineView:
    """What the router knows of one healthy engine for one prompt: its key
    in the pool, the prompt tokens it holds cached, the seconds from now to
    its first token as predicted under its load, the requests it serves
    now, when it was last given one (a counter; lower is longer ago), and
    whether it answered the request's session last (its ``home``)."""

    key: int
    cached: int
    first_token_s: float
    in_flight: int = 0
    last_used: int = 0
    home: bool = False


@dataclass(frozen=True)
class Decision:
    """The engine chosen, under which policy and why: ``longest prefix``,
    ``deadline`` (the engine holding the longest prefix would miss it),
    ``session's engine`` (no engine holds more of the prompt than the
    others, and the one that answered the session last is in time),
    ``earliest first token``, ``round robin``, ``least loaded``."""

    key: int
    policy: str
    reason: str


def check_policy(policy: str) -> str:
    """``policy`` if it is one of :data:`POLICIES`, else ValueError naming them."""
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(POLICIES)}")
    return policy


def _soonest(views: Sequence[EngineView]) -> EngineView:
    """The earliest predicted first token; ties to the engine used longest ago."""
    return min(views, key=lambda v: (v.first_token_s, v.last_used, v.key))


def choose(views: Sequence[EngineView], policy: str, *, budget_s: float | None, turn: int = 0) -> Decision:
    """The engine for one request among ``views`` (the healthy engines),
    whose first token is due within ``budget_s`` seconds (None: no
    deadline); ``turn`` counts the pool's requests, for round robin.

    Two engines, A holding 900 of the prompt's tokens and B 100; A predicts
    2.5 s under its load, B 1.2 s:
    ``choose(views, "affinity", budget_s=3.0) -> Decision(A, "affinity", "longest prefix")``,
    ``choose(views, "affinity", budget_s=2.0) -> Decision(B, "affinity", "deadline")``.
    """
    check_policy(policy)
    if not views:
        raise ValueError("no engine to choose from")
    if policy == "round_robin":
        ordered = sorted(views, key=lambda v: v.key)
        return Decision(ordered[turn % len(ordered)].key, policy, "round robin")
    if policy == "least_loaded":
        best = min(views, key=lambda v: (v.in_flight, v.last_used, v.key))
        return Decision(best.key, policy, "least loaded")
    soonest = _soonest(views)
    longest = max(v.cached for v in views)
    if all(v.cached == longest for v in views):
        # The session's engine may still hold its older prompts where the
        # client cannot see (a server's own prompt cache in RAM).
        home = [v for v in views if v.home and (budget_s is None or v.first_token_s <= budget_s)]
        if home:
            return Decision(home[0].key, policy, "session's engine")
        return Decision(soonest.key, policy, "earliest first token")
    holder = _soonest([v for v in views if v.cached == longest])
    if budget_s is None or holder.first_token_s <= budget_s or soonest.first_token_s > budget_s:
        return Decision(holder.key, policy, "longest prefix")
    return Decision(soonest.key, policy, "deadline")
