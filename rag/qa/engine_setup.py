"""What the engine's prompts cost, and its system prompt kept warm.

One engine answers every question, and one cost model plans for it. Several
engines are one address behind a router (``engine.remote.router``): the
router picks the worker, and the cost model learns what prompts cost at that
address from each response's own figures, the pool as a whole.

Does not: plan prompts (``planner``), measure (``calibrate``) or route.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from engine.backend import Backend, PrefixCache, Timings
from prompt_budget import system_message
from prompt_budget.profile import Profile

from ..conversations.memory import stable_prefix
from .costs import CostLearner

SYSTEM_STATE_KEY = "system"  # the pinned KV snapshot of the system prompt


class EngineSetup:
    """The engine of ``backend()`` and its :class:`CostLearner` (profiles
    under ``profile_dir``), made when first asked for."""

    def __init__(self, backend: Callable[[], Backend], profile_dir: Path, *, learn: bool = True,
                 notice: Callable[[str], None] = lambda message: None) -> None:
        self._backend = backend
        self.profile_dir, self.learn, self.notice = Path(profile_dir), learn, notice
        self._learner: CostLearner | None = None
        self.warmed = False  # whether the system prompt was prefilled and pinned
        self._lock = threading.Lock()

    @property
    def costs(self) -> CostLearner:
        """The engine's cost learner, made when first asked for."""
        with self._lock:
            if self._learner is None:
                self._learner = CostLearner(self._backend, self.profile_dir, learn=self.learn, notice=self.notice)
            return self._learner

    def prepare(self) -> None:
        """Load the engine's cost model (a quick calibration where it has none)."""
        _ = self.costs.model

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

    def calibrate(self, *, quick: bool = False, progress=None) -> Profile:
        """Measure the engine and save its profile; the profile."""
        return self.costs.calibrate(quick=quick, progress=progress)
