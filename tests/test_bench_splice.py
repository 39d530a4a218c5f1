"""The figures of `rag bench splice` (pure logic): agreement, KL and the default R."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag.evaluation.agreement import agreement, kl_divergence, splice_summary


def test_agreement_is_position_wise_over_the_full_prefills_answer():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, 1.0)
    assert agreement([1, 2, 3, 4], [1, 9, 3]) == (0.5, 0.25)  # a missing position disagrees
    assert agreement([1, 2], [1, 2, 3, 4]) == (1.0, 1.0)  # tokens past the full answer are not compared
    assert agreement([5, 6], [6, 5]) == (0.0, 0.0)
    assert agreement([], [1]) == (1.0, 1.0)


def test_kl_divergence_of_softmax_distributions():
    p = np.array([2.0, 0.0, -1.0])
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    assert kl_divergence(p, p + 5.0) == pytest.approx(0.0, abs=1e-12)  # logits up to a constant
    probs_p, probs_q = np.exp(p) / np.exp(p).sum(), np.array([1 / 3] * 3)
    expected = float(np.sum(probs_p * np.log(probs_p / probs_q)))
    assert kl_divergence(p, np.zeros(3)) == pytest.approx(expected)
    assert kl_divergence(p, np.zeros(3)) != pytest.approx(kl_divergence(np.zeros(3), p))  # not symmetric
    assert math.isfinite(kl_divergence(np.array([1e4, 0.0]), np.array([0.0, 1e4])))


def _row(fresh, agree, ttft=0.5, spliced=100):
    return {"fresh": fresh, "agreement": agree, "prefix_agreement": agree, "kl": 0.01, "ttft_cold_s": 1.0,
            "ttft_warm_s": ttft, "spliced_tokens": spliced, "passages": 3, "passages_found": 3, "timings_hold": True}


def test_the_default_R_is_the_smallest_whose_agreement_reaches_095():
    rows = [_row(0, 0.5), _row(0, 0.7), _row(4, 0.96), _row(4, 0.94), _row(16, 1.0), _row(16, 0.99)]
    summary = splice_summary(rows, [0, 4, 16])
    assert [r["agreement"] for r in summary["per_r"]] == [0.6, 0.95, 0.995]
    assert summary["default_r"] == 4 and summary["agreement_at_default"] == 0.95
    low = splice_summary([_row(0, 0.5), _row(4, 0.9)], [0, 4])
    assert low["default_r"] is None and low["agreement_at_default"] is None
    assert low["per_r"][0]["ttft_warm_p50_s"] == 0.5 and low["per_r"][0]["ttft_cold_p50_s"] == 1.0
    # An R past every passage's length splices nothing (so it agrees fully); one that saves no time is no default either.
    empty = splice_summary([_row(0, 0.3), _row(128, 1.0, ttft=1.0, spliced=0), _row(64, 0.97, ttft=1.1)], [0, 64, 128])
    assert empty["default_r"] is None
