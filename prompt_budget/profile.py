"""The prefill profile of one machine set-up, saved as JSON.

A profile holds the fitted cost model of one combination of what changes
prefill rates (model file, llama.cpp build, GPU layers, context, threads,
batch size: the *key*), the calibration measurements, and the recent online
samples. It is the only file this package reads or writes.

Does not: measure (see ``rag.calibrate``) or decide where profiles live.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .cost import FORMS, Fit, PrefillCostModel, PrefillSample, PromptShape, features, plausible
from .margin import UNKNOWN_CONTEXT, Margin
from .overhead import Overheads

PROFILE_FORMAT = "rag-budget-prefill-profile"
PROFILE_VERSION = 1
log = logging.getLogger("rag_budget.cache")


def batch_of(key: dict[str, object]) -> int | None:
    """The engine's batch size where its key says it (``n_batch``), else None.

    ``batch_of({"n_batch": 512}) -> 512``; ``batch_of({"engine": "remote"}) -> None``
    """
    n_batch = key.get("n_batch")
    return n_batch if isinstance(n_batch, int) and not isinstance(n_batch, bool) and n_batch > 0 else None


def profile_id(key: dict[str, object]) -> str:
    """A short stable id of a key: equal keys give equal ids."""
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


@dataclass
class Profile:
    """A calibrated cost model and what it was measured on."""

    key: dict[str, object]
    fit: Fit
    fits: dict[str, Fit] = field(default_factory=dict)
    anchors: list[PrefillSample] = field(default_factory=list)
    samples: list[PrefillSample] = field(default_factory=list)
    # The measured ÷ predicted ratio of each sample (None: not known), so that a busy period's can be told.
    sample_ratios: list[float | None] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    ratio_contexts: list[int] = field(default_factory=list)
    overheads: list[float] = field(default_factory=list)
    splice_reads: list[float] = field(default_factory=list)
    splice_pieces: list[float] = field(default_factory=list)
    table: list[dict[str, float]] = field(default_factory=list)
    quick: bool = False

    def cost_model(self) -> PrefillCostModel:
        """A live cost model starting from this profile."""
        return PrefillCostModel(
            self.fit, self.samples, anchors=self.anchors, sample_ratios=self.sample_ratios,
            margin=Margin(self.ratios, self.ratio_contexts),
            overheads=Overheads(self.overheads, self.splice_reads, self.splice_pieces),
            n_batch=batch_of(self.key),
        ).settled()  # a profile saved by an older version may still hold a busy period

    def absorb(self, model: PrefillCostModel) -> None:
        """Take the current state of a live model (after online updates),
        less its busy periods (``PrefillCostModel.settled``): the next
        process starts from the quiet machine's figures."""
        model = model.settled()
        self.fit = model.fit
        self.samples = list(model.samples)
        self.sample_ratios = list(model.sample_ratios)
        self.ratios = list(model.ratios)
        self.ratio_contexts = list(model.ratio_contexts)
        self.overheads = list(model.overheads)
        self.splice_reads = list(model.splice_reads)
        self.splice_pieces = list(model.splice_pieces)

    def to_json(self) -> str:
        """The profile as a JSON document with a format version."""
        def fit_dict(f: Fit) -> dict[str, object]:
            return {"form": f.form, "coef": list(f.coef), "mape": None if math.isnan(f.mape) else f.mape,
                    "samples": f.samples, "outliers": f.outliers}

        def sample_list(samples: list[PrefillSample]) -> list[list[float]]:
            # Cells other sequences held, only where there were some (profiles from before have three).
            return [[s.n_cached, s.n_new, s.seconds, *([s.n_others] if s.n_others else [])] for s in samples]

        return json.dumps(
            {
                "format": PROFILE_FORMAT,
                "version": PROFILE_VERSION,
                "id": profile_id(self.key),
                "key": self.key,
                "fit": fit_dict(self.fit),
                "fits": {k: fit_dict(v) for k, v in self.fits.items()},
                "anchors": sample_list(self.anchors),
                "samples": sample_list(self.samples),
                "sample_ratios": self.sample_ratios,
                "ratios": self.ratios,
                "ratio_contexts": self.ratio_contexts,
                "overheads": self.overheads,
                "splice_loads": self.splice_reads,  # the key profiles have always had
                "splice_pieces": self.splice_pieces,
                "table": self.table,
                "quick": self.quick,
            },
            indent=1,
            default=str,
        )

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        """Parse :meth:`to_json` output; ValueError if it is not a profile of this version."""
        try:
            raw = json.loads(text)
            if raw.get("format") != PROFILE_FORMAT or raw.get("version") != PROFILE_VERSION:
                raise ValueError(f"not a version {PROFILE_VERSION} prefill profile")

            def finite(x) -> float:
                value = float(x)
                if not math.isfinite(value):
                    raise ValueError(f"a value that is not finite ({x!r})")
                return value

            def fit_of(d: dict) -> Fit:
                mape = d.get("mape")
                if d.get("form") not in FORMS:
                    raise ValueError(f"unknown form {d.get('form')!r}")
                coef = tuple(finite(c) for c in d["coef"])
                if len(coef) != len(features(str(d["form"]), PromptShape(1))):
                    raise ValueError(f"{len(coef)} coefficients for the {d['form']} form")
                return Fit(str(d["form"]), coef,
                           math.nan if mape is None else float(mape), int(d["samples"]), int(d.get("outliers", 0)))

            def planned(fit: Fit) -> Fit:
                # A time per new token (and an attention term) of zero or less predicts
                # prompts as free: the budget would overshoot its target many times over.
                if not plausible(fit):
                    raise ValueError(f"a {fit.form} fit whose cost per token is not positive {list(fit.coef)}")
                return fit

            def positive(x) -> float:
                value = finite(x)
                if value <= 0:
                    raise ValueError(f"a ratio that is not positive ({x!r})")
                return value

            def nonnegative(x) -> float:
                value = finite(x)
                if value < 0:
                    raise ValueError(f"a negative time ({x!r})")
                return value

            def context(x) -> int:
                if isinstance(x, bool) or not isinstance(x, int) or x < UNKNOWN_CONTEXT:
                    raise ValueError(f"a cached-token count that is not a count ({x!r})")
                return x

            def samples_of(rows: list) -> list[PrefillSample]:
                def sample(row: list) -> PrefillSample:
                    if len(row) not in (3, 4):
                        raise ValueError(f"a sample of {len(row)} values")
                    return PrefillSample(int(row[0]), int(row[1]), finite(row[2]), int(row[3]) if len(row) == 4 else 0)
                return [sample(row) for row in rows]

            samples = samples_of(raw.get("samples", []))
            sample_ratios = [None if x is None else positive(x) for x in raw.get("sample_ratios", [])]
            if len(sample_ratios) > len(samples):
                raise ValueError(f"{len(sample_ratios)} sample ratios for {len(samples)} samples")
            return cls(
                key=dict(raw["key"]),
                fit=planned(fit_of(raw["fit"])),
                fits={k: fit_of(v) for k, v in raw.get("fits", {}).items()},
                anchors=samples_of(raw.get("anchors", [])),
                samples=samples,
                sample_ratios=sample_ratios,
                ratios=[positive(x) for x in raw.get("ratios", [])],
                ratio_contexts=[context(x) for x in raw.get("ratio_contexts", [])],
                overheads=[nonnegative(x) for x in raw.get("overheads", [])],
                splice_reads=[nonnegative(x) for x in raw.get("splice_loads", [])],
                splice_pieces=[nonnegative(x) for x in raw.get("splice_pieces", [])],
                table=list(raw.get("table", [])),
                quick=bool(raw.get("quick", False)),
            )
        except (KeyError, TypeError, AttributeError, OverflowError, IndexError, RecursionError) as exc:
            raise ValueError(f"malformed prefill profile ({type(exc).__name__}: {exc})"[:300]) from None


def profile_path(directory: Path, key: dict[str, object]) -> Path:
    """Where the profile of ``key`` lives under ``directory``."""
    return Path(directory) / f"prefill-{profile_id(key)}.json"


def load_profile(directory: Path, key: dict[str, object]) -> Profile | None:
    """The saved profile of ``key``, or None if there is none (or it is
    unreadable, or of another version: then it is measured again)."""
    path = profile_path(directory, key)
    try:
        profile = Profile.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        # Set aside, not deleted: a person may want to see what went wrong.
        aside = path.with_name(path.name + ".damaged")
        log.warning("set aside an unusable prefill profile %s as %s (%s); it will be measured again", path, aside.name, exc)
        try:
            os.replace(path, aside)
        except OSError:
            pass
        return None
    return profile if profile_id(profile.key) == profile_id(key) else None


def save_profile(directory: Path, profile: Profile) -> Path:
    """Write ``profile`` atomically (a crash leaves the old one) and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = profile_path(directory, profile.key)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".prefill-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(profile.to_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
