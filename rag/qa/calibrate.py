"""Measuring this machine's prefill rates and fitting the cost model.

Runs real prefills on the backend (one decoded token each): cold prompts of
a spread of lengths, repeated; a chain that grows one context up to
min(n_ctx, 4096) tokens in steps, so each step is measured on top of a
cached prefix; and short additions on top of long cached prefixes. Medians
of the repeats are fitted in every form of ``prompt_budget.cost`` and the
best is kept in a profile keyed by what changes the rates.

Does not: print (the CLI does) or choose where profiles live.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from engine.backend import Backend
from prompt_budget.cost import PrefillSample, best_fit
from prompt_budget.profile import Profile

from .. import paths


@dataclass(frozen=True)
class Measurement:
    """One planned prefill: ``n_new`` tokens after ``n_cached`` cached ones.

    ``kind`` is "cold" (nothing shared with the previous prompt), "chain"
    (the next stretch of one growing context) or "add" (fresh tokens after a
    prefix of that context).
    """

    kind: str
    n_cached: int
    n_new: int
    repeats: int


def calibration_plan(n_ctx: int, quick: bool = False) -> list[Measurement]:
    """The measurements to take, in an order that keeps the needed prefixes
    in the KV cache. Quick: a few short cold prompts only (a few seconds)."""
    if quick:
        return [Measurement("cold", 0, n, 2) for n in (32, 128, 384)]
    top = min(n_ctx, 4096) - 72  # room for a short addition and the decoded token
    # The chain starts with a fourth cold 512, so 512 itself is repeated twice.
    plan = [Measurement("cold", 0, n, 2 if n == 512 else 3) for n in (32, 64, 128, 256, 512) if n < top]
    bounds = [0] + [b for b in (512, 1024, 2048, 3072) if b < top] + [top]
    plan += [Measurement("chain", a, b - a, 1) for a, b in zip(bounds, bounds[1:])]
    plan += [Measurement("add", c, 64, 3) for c in sorted(set(bounds[2:]), reverse=True)]
    return plan


def filler_tokens(backend: Backend, n: int) -> list[int]:
    """At least ``n`` tokens of ordinary prose (the sample corpus, repeated)."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(paths.sample_data_dir().glob("*.md")))
    tokens = backend.tokenize(text)
    while len(tokens) < n:
        tokens = tokens + tokens
    return tokens


def calibrate(
    backend: Backend,
    *,
    quick: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Profile:
    """Measure prefill on ``backend``, fit the cost model, and return the
    profile (not yet saved). ``progress(done, total)`` is called as
    measurements complete."""
    plan = calibration_plan(backend.n_ctx, quick)
    total = sum(m.repeats for m in plan)
    stream = filler_tokens(backend, 2 * backend.n_ctx + 4096)
    chain = stream[: backend.n_ctx]
    fresh = backend.n_ctx  # where unused tokens for new parts start
    measured: dict[tuple[int, int], list[float]] = defaultdict(list)
    samples: list[PrefillSample] = []
    overheads: list[float] = []
    done = 0
    last_first: int | None = None
    for m in plan:
        for rep in range(m.repeats):
            if m.kind == "cold":
                # A cold prompt must not share its first token with the last one.
                start = fresh + 7 * rep
                while stream[start % len(stream)] == last_first:
                    start += 1
                tokens = [stream[(start + i) % len(stream)] for i in range(m.n_new)]
                fresh += m.n_new + 8
            elif m.kind == "chain":
                tokens = chain[: m.n_cached + m.n_new]
            else:
                tokens = chain[: m.n_cached] + stream[fresh : fresh + m.n_new]
                fresh += m.n_new
            last_first = tokens[0]
            _, t = backend.generate(tokens, max_tokens=1).result()
            if t.prefill_tokens > 0 and t.prefill_s > 0:
                samples.append(PrefillSample(t.cached_tokens, t.prefill_tokens, t.prefill_s))
                measured[(t.cached_tokens, t.prefill_tokens)].append(t.prefill_s)
                overheads.append(max(t.ttft_s - t.prefill_s, 0.0))
            done += 1
            if progress:
                progress(done, total)
    # The fit is made on the low medians, so one slow repeat cannot pull it: on a busy machine a
    # repeat waits for a core, and the median of two (their mean) bent the curve until it fell.
    medians = [PrefillSample(c, n, statistics.median_low(v)) for (c, n), v in sorted(measured.items())]
    fit, fits = best_fit(medians)
    table = [
        {
            "n_cached": s.n_cached,
            "n_new": s.n_new,
            "runs": len(measured[(s.n_cached, s.n_new)]),
            "median_s": round(s.seconds, 5),
            "tok_per_s": round(s.n_new / s.seconds, 1),
            **{f"{form}_s": round(f.predict(s.shape), 5) for form, f in fits.items()},
        }
        for s in medians
    ]
    return Profile(
        key=backend.profile_key(),
        fit=fit,
        fits=fits,
        anchors=medians,
        overheads=overheads[-32:],
        table=table,
        quick=quick,
    )

