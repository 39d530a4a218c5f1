"""The prefill cost model: fitting, online learning, and the saved profile."""

from __future__ import annotations

from dataclasses import replace

import json
import math
import random

import pytest

from prompt_budget.cost import (PrefillCostModel, PrefillSample, PromptShape, best_fit, fit_samples, plausible, prior_fit,
                                 size_key)
from prompt_budget.margin import MARGIN_ANSWERS, SAFETY_QUANTILE, UNKNOWN_CONTEXT, alike
from prompt_budget.recent import quantile
from prompt_budget.profile import Profile, batch_of, load_profile, profile_id, save_profile

A, B, C = 0.015, 1 / 210, 2.5e-7  # seconds, s/token, s/token² (about 158 tok/s at 4k tokens)


def _truth(n_new: int, n_cached: int) -> float:
    return A + B * n_new + C * n_new * (n_cached + n_new / 2)


def _samples(rng: random.Random, n: int, noise: float = 0.05) -> list[PrefillSample]:
    out = []
    for _ in range(n):
        n_new = rng.choice([32, 64, 128, 256, 512, 1024, 2048])
        n_cached = rng.choice([0, 0, 512, 1024, 2048])
        out.append(PrefillSample(n_cached, n_new, _truth(n_new, n_cached) * rng.uniform(1 - noise, 1 + noise)))
    return out


def test_attention_fit_recovers_known_coefficients_from_noisy_samples():
    fit = fit_samples(_samples(random.Random(1), 200), "attention")
    a, b, c = fit.coef
    assert b == pytest.approx(B, rel=0.05)
    assert c == pytest.approx(C, rel=0.25)
    assert fit.mape < 0.05


def test_the_form_the_data_supports_is_kept():
    rng = random.Random(2)
    quadratic = _samples(rng, 120, noise=0.02)
    chosen, fits = best_fit(quadratic)
    assert chosen.form == "attention" and fits["attention"].mape < fits["linear"].mape
    linear = [PrefillSample(c, n, 0.01 + n / 200 * rng.uniform(0.98, 1.02)) for c, n, _ in
              [(s.n_cached, s.n_new, 0) for s in quadratic]]
    assert best_fit(linear)[0].form == "linear"


def test_outliers_do_not_pull_the_fit():
    rng = random.Random(3)
    samples = _samples(rng, 100, noise=0.02)
    samples += [PrefillSample(0, 512, _truth(512, 0) * 5) for _ in range(5)]  # a few stalls
    fit = fit_samples(samples, "attention")
    assert fit.outliers >= 5
    assert fit.predict(PromptShape(512)) == pytest.approx(_truth(512, 0), rel=0.05)


def test_online_learning_follows_a_slower_machine():
    rng = random.Random(4)
    start = fit_samples(_samples(rng, 60, 0.02), "attention")
    model = PrefillCostModel(start, window=64)
    for _ in range(200):  # the machine became 1.5x slower
        n = rng.choice([64, 256, 700, 1500])
        model.observe(PrefillSample(0, n, 1.5 * _truth(n, 0) * rng.uniform(0.97, 1.03)))
    assert model.predict(PromptShape(700)) == pytest.approx(1.5 * _truth(700, 0), rel=0.08)
    assert len(model.samples) == 64  # the window is bounded


def test_a_size_the_form_gets_wrong_is_corrected_from_recent_requests():
    fit = fit_samples(_samples(random.Random(9), 80, 0.0), "attention")
    model = PrefillCostModel(fit)
    rng = random.Random(10)
    for _ in range(40):  # short prompts run 15 % faster than the form says; long ones as it says
        n = rng.choice([90, 100, 110])
        model.observe(PrefillSample(74, n, 0.85 * _truth(n, 74) * rng.uniform(0.99, 1.01)), refit=False)
        n = rng.choice([700, 800])
        model.observe(PrefillSample(74, n, _truth(n, 74) * rng.uniform(0.99, 1.01)), refit=False)
    model.refit()
    assert model.predict(PromptShape(100, 74)) == pytest.approx(0.85 * _truth(100, 74), rel=0.03)
    assert model.predict(PromptShape(750, 74)) == pytest.approx(_truth(750, 74), rel=0.03)
    assert model.correction(5000) == 1.0  # no requests that large: the form alone


def test_what_cached_context_costs_is_learned_after_a_calibration_that_had_none():
    # A quick calibration prefills from an empty cache only, so it fits the linear form. Answers
    # then come with short and long cached contexts (a conversation, held passages); each new
    # token attends to all of it, here a third more per token at 700 cached tokens (measured on
    # this machine's rag bench ttft, 2026-12-04). A model kept linear could not tell the two
    # apart and charged the short-context prompts what the long ones had cost.
    a, b, c = 0.03, 0.0028, 1.0e-6

    def truth(n_new: int, n_cached: int) -> float:
        return a + b * n_new + c * n_new * (n_cached + n_new / 2)

    anchors = [PrefillSample(0, n, truth(n, 0)) for n in (32, 128, 384, 1024)]
    model = PrefillCostModel(fit_samples(anchors, "linear"), anchors=anchors)
    assert model.fit.form == "linear"
    rng = random.Random(11)
    for _ in range(30):
        for cached in (74, 700):
            n = rng.randrange(120, 480)
            model.observe(PrefillSample(cached, n, truth(n, cached) * rng.uniform(0.98, 1.02)))
    for _ in range(12):  # the latest requests all had the long context
        n = rng.randrange(120, 480)
        model.observe(PrefillSample(700, n, truth(n, 700) * rng.uniform(0.98, 1.02)))
    assert model.fit.form == "attention"
    assert model.predict(PromptShape(150, 74)) == pytest.approx(truth(150, 74), rel=0.05)
    assert model.predict(PromptShape(150, 700)) == pytest.approx(truth(150, 700), rel=0.05)


def test_what_other_sequences_cells_cost_is_learned_once_answers_show_it():
    # Three conversations on one engine: a prompt's tokens pass over every cell the other sequences
    # hold (masked), measured in rag bench chat at about a sixth of attending to a cell. Calibration
    # prefills with the cache to itself, so the attention form is kept until answers show the term.
    a, b, c, d = 0.03, 0.0029, 1.0e-6, 1.7e-7

    def truth(n_new: int, n_cached: int, n_others: int) -> float:
        return a + b * n_new + c * n_new * (n_cached + n_new / 2) + d * n_new * n_others

    anchors = [PrefillSample(cached, n, truth(n, cached, 0)) for n in (32, 128, 384, 1024) for cached in (0, 512)]
    chosen, fits = best_fit(anchors)
    assert chosen.form == "attention" and "occupancy" not in fits  # nothing held by others: no term to see
    model = PrefillCostModel(fit_samples(anchors, "attention"), anchors=anchors)
    rng = random.Random(12)
    for _ in range(60):
        n, cached, others = rng.randrange(150, 450), rng.randrange(60, 1800), rng.randrange(0, 6000)
        model.observe(PrefillSample(cached, n, truth(n, cached, others) * rng.uniform(0.98, 1.02), others))
    assert model.fit.form == "occupancy"
    assert model.predict(PromptShape(400, 570, 5000)) == pytest.approx(truth(400, 570, 5000), rel=0.05)
    assert model.predict(PromptShape(400, 570, 0)) == pytest.approx(truth(400, 570, 0), rel=0.05)
    # Saved and read back, the cells the others held stay with each sample.
    profile = Profile(key={"model": "m"}, fit=model.fit, anchors=anchors)
    profile.absorb(model)
    again = Profile.from_json(profile.to_json())
    assert again.samples == list(model.samples) and again.fit == model.fit


def _steady_model(rng: random.Random) -> PrefillCostModel:
    model = PrefillCostModel(fit_samples(_samples(rng, 60, 0.0), "attention"))
    for _ in range(100):  # a long steady stretch
        n = rng.choice([100, 300, 800])
        model.observe(PrefillSample(74, n, _truth(n, 74) * rng.uniform(0.98, 1.02)))
    return model


def test_a_sudden_slowdown_is_followed_within_two_answers_at_every_size():
    rng = random.Random(11)
    model = _steady_model(rng)
    for _ in range(2):  # then a neighbour takes a core: the machine runs 80 % slower
        n = rng.choice([250, 300, 350])
        model.observe(PrefillSample(74, n, 1.8 * _truth(n, 74) * rng.uniform(0.98, 1.02)))
    assert model.predict(PromptShape(300, 74)) == pytest.approx(1.8 * _truth(300, 74), rel=0.06)
    # A neighbour slows every size alike: a size not asked since is planned at the new pace too.
    assert model.predict(PromptShape(3000, 74)) == pytest.approx(1.8 * model.fit.predict(PromptShape(3000, 74))
                                                                 * model.correction(3000), rel=0.06)
    for _ in range(2):  # the neighbour stops
        n = rng.choice([250, 300, 350])
        model.observe(PrefillSample(74, n, _truth(n, 74) * rng.uniform(0.98, 1.02)))
    assert model.pace == pytest.approx(1.0, abs=0.06)


def test_one_slow_answer_does_not_move_the_pace():
    rng = random.Random(13)
    model = _steady_model(rng)
    before = model.predict(PromptShape(300, 74))
    model.observe(PrefillSample(74, 300, 2.5 * _truth(300, 74)))  # a page fault, a stall
    assert model.predict(PromptShape(300, 74)) == pytest.approx(before, rel=0.05)
    assert model.pace == pytest.approx(1.0, abs=0.05)


def test_a_second_batch_is_learned_as_a_size_not_taken_for_the_machine_slowing():
    # The engine evaluates a prompt in batches of 512: one just past it pays a second call (here 0.4 s
    # more than its tokens). Prompts of 480-510 and 520-560 new tokens alternate, as a 2 s target's do.
    def machine(n: int) -> float:
        return _truth(n, 74) + (0.4 if n > 512 else 0.0)

    rng = random.Random(17)
    model = PrefillCostModel(fit_samples(_samples(rng, 60, 0.0), "attention"), n_batch=512)
    errors = []
    for i in range(40):
        n = rng.randrange(480, 511) if i % 2 else rng.randrange(520, 561)
        errors.append(abs(model.predict(PromptShape(n, 74)) / machine(n) - 1))
        model.observe(PrefillSample(74, n, machine(n) * rng.uniform(0.98, 1.02)))
    assert quantile(errors[-20:], 0.5) < 0.04  # learned within the first 20: the pace no longer swings
    assert model.predict(PromptShape(540, 74)) == pytest.approx(machine(540), rel=0.05)
    assert model.predict(PromptShape(500, 74)) == pytest.approx(machine(500), rel=0.05)
    assert model.pace == pytest.approx(1.0, abs=0.05)


def test_the_batch_comes_from_the_profile_key():
    assert batch_of({"n_batch": 512}) == 512
    assert batch_of({"engine": "remote"}) is None and batch_of({"n_batch": True}) is None
    profile = Profile(key={"model": "m", "n_batch": 256}, fit=prior_fit())
    assert profile.cost_model().n_batch == 256
    assert size_key(300, 256) == (2, pytest.approx(2 * math.log2(300)))
    assert size_key(300, None)[0] == size_key(200, 256)[0] == 1


def test_safety_factor_is_a_high_quantile_of_real_errors():
    model = PrefillCostModel(fit_samples(_samples(random.Random(5), 50, 0.0), "attention"))
    rng = random.Random(6)
    for _ in range(64):
        n = rng.choice([100, 400, 900])
        model.observe(PrefillSample(0, n, _truth(n, 0) * rng.uniform(0.9, 1.1)), refit=False)
    assert 1.05 < model.safety_factor(0.95, tolerance=1.0) <= 1.1
    assert model.safety_factor(0.95, tolerance=1.0) >= quantile(list(model.ratios), 0.5)
    # Within the default tolerance of 1.1x the target, a ±10 % error needs no margin.
    assert model.safety_factor(0.95) == 1.0
    for _ in range(6):  # a burst of stalls (another process hogging the cores)
        model.observe(PrefillSample(0, 400, _truth(400, 0) * 3.0), refit=False)
    assert model.safety_factor(0.95, tolerance=1.0) <= 1.12


def test_the_margin_lets_the_slowest_twentieth_start_within_the_tolerance():
    model = PrefillCostModel(fit_samples(_samples(random.Random(5), 50, 0.0), "attention"))
    rng = random.Random(8)
    for _ in range(64):  # mostly on time, one in ten 25 % slow
        n = rng.choice([100, 400, 900])
        model.observe(PrefillSample(0, n, _truth(n, 0) * (1.25 if rng.random() < 0.1 else 1.0)), refit=False)
    q95 = quantile([r for r in model.ratios], 0.95)
    assert q95 > 1.15
    assert model.safety_factor(0.95) == pytest.approx(q95 / 1.10)
    assert model.safety_factor(0.95, tolerance=1.0) == pytest.approx(q95)
    # Planned at the 95th percentile, a run's own p95 sits on the tolerance: the margin plans for 2 %.
    assert SAFETY_QUANTILE == 0.98
    assert model.safety_factor() == pytest.approx(quantile(list(model.ratios), 0.98) / 1.10)


def test_the_margin_is_drawn_from_prompts_on_a_like_cached_context():
    model = PrefillCostModel(fit_samples(_samples(random.Random(5), 50, 0.0), "attention"))
    rng = random.Random(9)
    for _ in range(64):  # fresh questions on time; conversation turns on a long context, one in ten 30 % slow
        n = rng.choice([100, 300])
        model.observe(PrefillSample(70, n, _truth(n, 70) * rng.uniform(0.98, 1.02)), refit=False)
        model.observe(PrefillSample(1500, n, _truth(n, 1500) * (1.3 if rng.random() < 0.1 else 1.0)), refit=False)
    assert model.ratio_contexts[-2:] == (70, 1500)
    # Drawn from all recent prompts alike, fresh questions would carry the turns' margin.
    assert model.safety_factor() > 1.15
    assert model.safety_factor(n_cached=74) == 1.0
    assert model.safety_factor(n_cached=1200) > 1.15
    # No recent prompt on a context like 400 tokens: all recent prompts say.
    assert model.safety_factor(n_cached=400) == model.safety_factor()


def test_contexts_are_alike_within_a_factor_of_two():
    assert alike(1000, 1900) and alike(0, 30) and alike(16, 64)
    assert not alike(66, 1000) and not alike(1000, 2100)
    assert not alike(UNKNOWN_CONTEXT, 70)


def test_cached_tokens_never_cost_more_than_uncached():
    fit = fit_samples(_samples(random.Random(7), 100), "attention")
    for total in (64, 512, 2000):
        for cached in (0, total // 4, total // 2, total - 1):
            assert fit.predict(PromptShape(total - cached, cached)) <= fit.predict(PromptShape(total, 0)) + 1e-12


def test_quantile_interpolates():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([5], 0.95) == 5


def test_profile_round_trips_and_is_keyed(tmp_path):
    key = {"model": "m.gguf:1:abc", "build": "0.3+x", "n_gpu_layers": 0, "n_ctx": 4096, "n_threads": 2, "n_batch": 512}
    samples = _samples(random.Random(8), 30)
    best, fits = best_fit(samples)
    profile = Profile(key=key, fit=best, fits=fits, anchors=samples[:10], samples=samples[10:], ratios=[1.0, 1.1])
    path = save_profile(tmp_path, profile)
    assert json.loads(path.read_text())["version"] == 1
    loaded = load_profile(tmp_path, dict(key))
    assert loaded is not None and loaded.fit == best and loaded.anchors == samples[:10]
    assert loaded.cost_model().predict(PromptShape(500, 100)) == pytest.approx(profile.cost_model().predict(PromptShape(500, 100)))
    # Ratios saved before their contexts were kept read back as of an unknown context.
    assert loaded.cost_model().ratio_contexts == (UNKNOWN_CONTEXT, UNKNOWN_CONTEXT)
    model = loaded.cost_model()
    model.observe(PrefillSample(70, 300, 0.5))
    loaded.absorb(model)
    again = Profile.from_json(loaded.to_json()).cost_model()
    assert again.ratios == model.ratios and again.ratio_contexts == (UNKNOWN_CONTEXT, UNKNOWN_CONTEXT, 70)
    for bad in (-2, 1.5, "70", True):
        raw = json.loads(loaded.to_json())
        raw["ratio_contexts"] = [bad]
        with pytest.raises(ValueError, match="cached-token count"):
            Profile.from_json(json.dumps(raw))
    for changed in ({"n_threads": 4}, {"n_ctx": 2048}, {"model": "other.gguf:1:def"}, {"n_gpu_layers": -1}):
        assert load_profile(tmp_path, key | changed) is None
        assert profile_id(key | changed) != profile_id(key)
    path.write_text("{not json")
    assert load_profile(tmp_path, key) is None  # unreadable: measured again, never a crash


def test_a_spliced_request_teaches_the_splice_cost_not_the_prefill_rate(tmp_path):
    from engine import FakeBackend
    from engine.backend import Timings
    from rag.qa.costs import CostLearner

    keeper = CostLearner(lambda: FakeBackend(), tmp_path, learn=True)
    model = keeper.model
    before, prior = model.predict(PromptShape(150, 1100)), model.splice_seconds(1000, 8)
    assert prior > 0
    # Evaluated in pieces between its passages, its prefill took 0.8 s more than a plain one.
    t = Timings(prompt_tokens=1250, cached_tokens=1100, prefill_tokens=150, ttft_s=before + 0.9,
                prefill_s=before + 0.8, decode_tokens=1, decode_s=0.01, total_s=before + 1.0,
                spliced_tokens=1000, spliced_passages=8, splice_s=0.01)
    for _ in range(3):
        keeper.observe(t, 0.0)
    assert model.predict(PromptShape(150, 1100)) == pytest.approx(before)  # the prefill rate is left as it was
    assert model.splice_seconds(1000, 8) == pytest.approx(0.81, rel=0.01)
    assert model.splice_seconds(500, 4) == pytest.approx(0.405, rel=0.01)
    # The pieces cost per passage, the load per token: two long passages cost less than eight.
    assert model.splice_seconds(1000, 2) == pytest.approx(0.21, rel=0.01)


def test_a_prompt_evaluated_beside_other_requests_teaches_nothing(tmp_path):
    from engine import FakeBackend
    from engine.backend import Timings
    from rag.qa.costs import CostLearner

    keeper = CostLearner(lambda: FakeBackend(), tmp_path, learn=True)
    model = keeper.model
    samples, ratios, overheads = model.samples, model.ratios, model.overheads
    plain = model.predict(PromptShape(400, 70))
    # Beside seven decoding answers its 400 tokens took twice as long: the load, not this machine's prefill rate.
    t = Timings(prompt_tokens=470, cached_tokens=70, prefill_tokens=400, ttft_s=2 * plain + 0.5,
                prefill_s=2 * plain, decode_tokens=1, decode_s=0.01, total_s=2 * plain + 0.6, shared_prefill=True)
    for _ in range(10):
        keeper.observe(t, 0.0)
    assert (model.samples, model.ratios, model.overheads) == (samples, ratios, overheads)
    assert model.predict(PromptShape(400, 70)) == plain
    keeper.observe(replace(t, shared_prefill=False), 0.0)  # alone, the same figures are learned
    assert len(model.samples) == len(samples) + 1


def test_what_splices_taught_survives_a_saved_profile():
    profile = Profile(key={"model": "m.gguf"}, fit=prior_fit(200.0))
    model = profile.cost_model()
    model.observe_splice(1000, 8, 0.02, 0.4)
    profile.absorb(model)
    again = Profile.from_json(profile.to_json()).cost_model()
    assert again.splice_seconds(500, 4) == pytest.approx(model.splice_seconds(500, 4)) == pytest.approx(0.21)


def test_a_slow_repeat_on_a_busy_machine_does_not_bend_the_quick_calibration():
    # On a busy machine one of a size's two repeats can wait for a core: its prefill took longer
    # for a reason that has nothing to do with its size. The mean of two (the median of an even
    # count) let it pull the fitted curve until it fell with prompt size.
    from engine.fake import FakeBackend
    from rag.qa.calibrate import calibrate

    class Busy(FakeBackend):
        spiked = False  # the first 32-token prompt waited for a core: 20 times its time

        def _stream(self, tokens, max_tokens, session, *rest):
            if len(tokens) == 32 and not self.spiked:
                self.spiked, self.seconds_per_token = True, self.seconds_per_token * 20
            try:
                return (yield from super()._stream(tokens, max_tokens, session, *rest))
            finally:
                self.seconds_per_token = 0.005

    fit = calibrate(Busy(seconds_per_token=0.005), quick=True).fit
    curve = [fit.predict(PromptShape(n)) for n in range(1, 1025, 8)]
    assert all(a < b for a, b in zip(curve, curve[1:])), fit


def test_an_online_refit_that_would_make_long_prompts_cheaper_is_not_kept():
    # Samples where a longer prompt took less time (a noisy busy machine): the attention form fitted
    # to them has a falling quadratic term, which a saved profile refuses; the model keeps a fit
    # that can plan, so what it saves loads again (the CI failure of 2026-12-04).
    start = fit_samples(_samples(random.Random(5), 60, 0.02), "attention")
    model = PrefillCostModel(start, window=16)
    for n, seconds in [(100, 0.40), (200, 0.75), (400, 1.30), (800, 1.90), (1600, 2.60), (3000, 3.1)] * 3:
        model.observe(PrefillSample(0, n, seconds))
    assert fit_samples(list(model.samples), "attention").coef[2] < 0  # the data would bend the curve down
    assert plausible(model.fit)
    assert model.predict(PromptShape(100)) < model.predict(PromptShape(1600)) < model.predict(PromptShape(3000))


def _calibrated() -> PrefillCostModel:
    anchors = [PrefillSample(0, n, _truth(n, 0)) for n in (32, 64, 128, 256, 512)]
    anchors += [PrefillSample(512, 512, _truth(512, 512)), PrefillSample(1024, 1024, _truth(1024, 1024))]
    return PrefillCostModel(fit_samples(anchors, "attention"), anchors=anchors)


def _ask(model: PrefillCostModel, rng: random.Random, busy: bool) -> None:
    """One answer on a 98-token cached system prompt: quiet, ±4 % with one prefill in 25 a quarter slow
    (this machine's own error); busy, beside a CPU-bound neighbour, up to 75 % slow (issue 37: error p50 18 %)."""
    n = rng.choice([150, 250, 400, 600, 900])
    slow = rng.uniform(1.0, 1.75) if busy else rng.uniform(0.96, 1.04) * (1.25 if rng.random() < 0.04 else 1.0)
    model.observe(PrefillSample(98, n, _truth(n, 98) * slow))


def _quiet_and_busy(busy: int, after: int = 20) -> tuple[PrefillCostModel, PrefillCostModel]:
    """A model that never saw a busy period and one that saw ``busy`` busy answers between the same quiet
    ones (100 before, ``after`` after)."""
    never, seen = _calibrated(), _calibrated()
    for model in (never, seen):
        rng = random.Random(3)  # the same quiet answers for both
        for _ in range(100):
            _ask(model, rng, False)
        if model is seen:
            neighbour = random.Random(9)
            for _ in range(busy):
                _ask(model, neighbour, True)
        for _ in range(after):
            _ask(model, rng, False)
    return never, seen


def _planned(model: PrefillCostModel) -> float:
    return model.safety_factor(n_cached=98) * model.predict(PromptShape(500, 98))


@pytest.mark.parametrize("busy", [48, 200])
def test_a_busy_period_stops_costing_passages_within_twenty_quiet_questions(busy):
    never, during = _quiet_and_busy(busy, after=0)
    assert _planned(during) > 1.3 * _planned(never)  # while busy, a prompt is planned slower
    never, seen = _quiet_and_busy(busy, after=20)
    # The margin is drawn from quiet answers only: whether one of the quiet machine's rare slow prefills
    # lies among its last MARGIN_ANSWERS is what still sets the two apart (within 15 %).
    assert max(seen.ratios[-MARGIN_ANSWERS:]) < 1.35
    assert seen.safety_factor(n_cached=98) == pytest.approx(never.safety_factor(n_cached=98), rel=0.15)
    assert seen.predict(PromptShape(500, 98)) == pytest.approx(never.predict(PromptShape(500, 98)), rel=0.10)
    assert _planned(seen) == pytest.approx(_planned(never), rel=0.15)


def test_a_profile_saved_in_a_busy_period_starts_the_next_process_from_the_quiet_figures(tmp_path):
    from engine import FakeBackend
    from rag.qa.costs import CostLearner

    never, busy = _quiet_and_busy(48, after=0)  # saved while the neighbour still ran
    key = FakeBackend().profile_key()
    profile = Profile(key=key, fit=busy.fit, anchors=list(busy.anchors))
    profile.absorb(busy)
    save_profile(tmp_path, profile)
    model = CostLearner(lambda: FakeBackend(), tmp_path).model  # the next process
    assert model.safety_factor(n_cached=98) == pytest.approx(never.safety_factor(n_cached=98), rel=0.15)
    assert _planned(model) == pytest.approx(_planned(never), rel=0.15)
    # The file itself holds no busy-period ratio: a person reading it sees the quiet machine.
    saved = json.loads(next(tmp_path.glob("prefill-*.json")).read_text())
    assert max(saved["ratios"]) < 1.35  # the quiet machine's own slowest: 1.25 × up to 1.04, on a pace a few % under 1
