"""Which engine answers a question, and what each engine's prompts cost.

One engine: every question goes to it and one cost model plans for it.
A pool of engines (``engine.remote.pool``): each engine keeps its own cost
profile, measured by the same calibration and keyed by its own URL, model,
build and context; before a prompt is planned, the pool routes it (see
``engine.remote.routing``) with each engine's first token predicted from that
engine's profile and the wait behind what it serves now, and the prompt is
then planned for the engine chosen. That choice is this module's one step:
:meth:`EngineDesk.route`.

Does not: plan prompts (``planner``), measure (``calibrate``) or talk to
engines beyond asking the pool to route.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Sequence

from engine.backend import Backend, PrefixCache, Routing, Timings
from engine.remote.pool import Route
from prompt_budget import system_message
from prompt_budget.profile import Profile

from ..conversations.keeper import stable_prefix
from .costs import CostKeeper
from .planner import load_plan

SYSTEM_STATE_KEY = "system"  # the pinned KV snapshot of the system prompt


class EngineDesk:
    """The engines of ``backend()`` (one, or a pool's) and a
    :class:`CostKeeper` for each, profiles under ``profile_dir``."""

    def __init__(self, backend: Callable[[], Backend], profile_dir: Path, *, learn: bool = True,
                 notice: Callable[[str], None] = lambda message: None) -> None:
        self._backend = backend
        self.profile_dir, self.learn, self.notice = Path(profile_dir), learn, notice
        self._keepers: dict[int, CostKeeper] = {}
        self.warmed = False  # whether the system prompt was prefilled and pinned
        self._lock = threading.Lock()

    def engines(self) -> list[Backend]:
        """The engines questions go to: a pool's (healthy first), or the one backend."""
        backend = self._backend()
        return list(backend.engines()) if isinstance(backend, Routing) else [backend]

    def keeper(self, engine: Backend) -> CostKeeper:
        """The cost keeper of ``engine`` (one of :meth:`engines`)."""
        with self._lock:
            keeper = self._keepers.get(id(engine))
            if keeper is None:
                keeper = CostKeeper(lambda: engine, self.profile_dir, learn=self.learn, notice=self.notice)
                self._keepers[id(engine)] = keeper
            return keeper

    @property
    def main(self) -> CostKeeper:
        """The keeper of the first (healthy) engine: the only one without a pool."""
        return self.keeper(self.engines()[0])

    def prepare(self) -> None:
        """Load every reachable engine's cost model (a quick calibration where it has none)."""
        for engine in self.engines():
            if getattr(engine, "healthy", True):
                _ = self.keeper(engine).model

    def warm_up(self) -> Timings | None:
        """Prefill the system prompt now and keep its KV state pinned, so
        every question, in any conversation, finds it cached; what that cost
        (None for an engine without a prefix cache)."""
        backend = self._backend()
        timings = None
        if isinstance(backend, PrefixCache):
            timings = backend.prefill(stable_prefix(backend, [system_message()]), session=SYSTEM_STATE_KEY, pin=True)
        self.warmed = True  # only once it held: after a failed prefill the next prepare tries again
        return timings

    def calibrate(self, *, quick: bool = False, progress=None) -> list[Profile]:
        """Measure every reachable engine, one after the other, and save
        each one's profile; the profiles, first engine first."""
        return [self.keeper(engine).calibrate(quick=quick, progress=progress)
                for engine in self.engines() if getattr(engine, "healthy", True)]

    def route(self, prompt_start: Callable[[], Sequence[int]], deadline: float | None,
              session: str | None = None) -> Route:
        """The engine for a question whose prompt starts with
        ``prompt_start()`` (asked only of a pool), whose first token is due
        at ``deadline``, in the engine's session ``session``: each engine's
        first token is predicted from its own profile, plus the wait behind
        what it serves now."""
        backend = self._backend()
        if not isinstance(backend, Routing):
            return Route(backend)

        def estimate(engine: Backend, cached: int, n: int) -> float:
            cost = self.keeper(engine).model
            load = load_plan(engine, cost, deadline)
            return cost.overhead() + load.wait_s + load.slowdown * cost.predict(max(n - cached, 1), cached, load.others(cached))

        return backend.route(prompt_start(), deadline=deadline, estimate=estimate, session=session)
