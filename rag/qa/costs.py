"""Keeping the prefill cost model of this machine set-up: loading its saved
profile (or calibrating one now), learning from every answer, and saving
what it learned.

Does not: plan prompts (the planner asks the model) or measure by itself
(``calibrate`` does, on the backend).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Callable

from engine.backend import Backend, Timings
from prompt_budget import PrefillCostModel, PrefillSample, PromptShape
from prompt_budget.profile import Profile, load_profile, save_profile

from .passages import exact_reuse


class CostLearner:
    """The cost model of ``backend()``'s set-up, its profile under
    ``profile_dir``, and online learning (``learn``). Thread safe."""

    def __init__(
        self,
        backend: Callable[[], Backend],
        profile_dir: Path,
        *,
        learn: bool = True,
        notice: Callable[[str], None] = lambda message: None,
    ) -> None:
        self._backend = backend
        self.profile_dir = Path(profile_dir)
        self.learn = learn
        self.notice = notice
        self._profile: Profile | None = None
        self._model: PrefillCostModel | None = None
        self._lock = threading.RLock()

    @property
    def model(self) -> PrefillCostModel:
        """The cost model: the saved profile's, else a quick calibration run
        now (and saved)."""
        with self._lock:
            if self._model is None:
                profile = load_profile(self.profile_dir, self._backend().profile_key())
                if profile is None:
                    self.notice(
                        "no prefill profile for this model and machine yet: running a quick calibration "
                        "(a few seconds; `rag calibrate` measures a full one)"
                    )
                    profile = self.calibrate(quick=True)
                self._profile, self._model = profile, profile.cost_model()
            return self._model

    def view(self, steps: int = 48) -> dict[str, object]:
        """The cost model as it stands, to be drawn: the profile's ``key``
        and ``fit`` (form, coefficients, error), ``overhead_s`` and
        ``safety``, every measured ``point`` (calibration anchors and recent
        answers: cached and new tokens, measured and predicted prefill
        seconds), and the ``curve`` of a prompt with nothing cached, from
        one token to the context size: predicted prefill and TTFT seconds."""
        model = self.model
        with self._lock:
            profile = self._profile
        fit, overhead = model.fit, model.overhead()
        points = [
            {"n_cached": s.n_cached, "n_new": s.n_new, "seconds": s.seconds, "kind": kind,
             "predicted_s": model.predict(s.shape)}
            for kind, samples in (("calibration", model.anchors), ("answer", model.samples)) for s in samples
        ]
        top = max([self._backend().n_ctx] + [s.n_new for s in model.anchors + model.samples])
        sizes = sorted({max(1, round(top * i / steps)) for i in range(steps + 1)})
        return {
            "key": dict(profile.key) if profile else {},
            "quick": bool(profile and profile.quick),
            "fit": {"form": fit.form, "coef": list(fit.coef), "mape": None if math.isnan(fit.mape) else fit.mape,
                    "samples": fit.samples},
            "overhead_s": overhead,
            "safety": model.safety_factor(),
            "points": points,
            "curve": [{"tokens": n, "prefill_s": model.predict(PromptShape(n)), "ttft_s": overhead + model.predict(PromptShape(n))}
                      for n in sizes],
        }

    def calibrate(self, *, quick: bool = False, progress=None) -> Profile:
        """Measure prefill on the backend, fit the cost model, save the
        profile and use it from now on."""
        from .calibrate import calibrate

        profile = calibrate(self._backend(), quick=quick, progress=progress)
        with self._lock:
            save_profile(self.profile_dir, profile)
            self._profile, self._model = profile, profile.cost_model()
        return profile

    def observe(self, timings: Timings, planned_at_s: float) -> None:
        """Fold one request's measurements into the model (its prefill, and
        the time to first token outside prefill, ``planned_at_s`` of which
        was spent before planning finished) and save the profile; a prompt
        evaluated beside other requests teaches nothing."""
        model = self.model
        if timings.shared_prefill:
            # Evaluated beside other requests' tokens: neither a plain prefill nor this set-up's overhead
            # (what the load adds is measured from the engine's own steps, see engine.scheduler.slowdown).
            return
        if timings.spliced_tokens:
            # A spliced prompt is evaluated in pieces between its passages: what its prefill took beyond
            # a plain one of its new tokens is the splice's cost, not a sign that the prefill rate moved.
            plain = model.predict(PromptShape(timings.prefill_tokens, timings.cached_tokens, timings.others_cells))
            model.observe_splice(timings.spliced_tokens, timings.spliced_passages, timings.splice_s,
                                 timings.prefill_s - plain)
        if not timings.spliced_tokens or exact_reuse(self._backend()):
            # Exact passages follow on from the cache: the rest is one plain prefill over them.
            model.observe(PrefillSample(timings.cached_tokens, timings.prefill_tokens, timings.prefill_s,
                                        timings.others_cells), refit=self.learn)
        # A snapshot restore and a wait in the queue are their own costs,
        # not the engine's fixed overhead.
        model.observe_overhead(timings.ttft_s - planned_at_s - timings.prefill_s - timings.restore_s - timings.queue_s
                               - timings.splice_s)
        if not self.learn:
            return
        with self._lock:
            if self._profile is None:
                return
            self._profile.absorb(model)
            try:
                save_profile(self.profile_dir, self._profile)
            except OSError:
                pass  # a read-only cache must not fail an answer
