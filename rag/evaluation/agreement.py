"""How far a spliced continuation is from a full prefill's: the agreement
of two greedy answers token by token, the KL divergence of two next-token
distributions, and the figures per R of ``rag bench splice`` with the
default R they imply.

Agreement (what decides the default R) is position-wise: the share of the
``n`` positions where the spliced answer's token equals the full prefill's
(a shorter spliced answer disagrees at every position it lacks). Prefix
agreement is the share before the first difference. KL is
KL(full || spliced) of the next-token distributions (softmax of the raw
logits, no penalty).

Does not: run a model; ``rag.bench.splice`` measures the rows these judge.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .stats import mean, percentile

AGREEMENT = 0.95  # the least mean agreement a default R must reach


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) in nats of the softmax distributions of two logit rows.

    ``kl_divergence(np.zeros(3), np.zeros(3)) -> 0.0``
    """
    lp = _log_softmax(np.asarray(p_logits, dtype=np.float64))
    lq = _log_softmax(np.asarray(q_logits, dtype=np.float64))
    return max(float(np.sum(np.exp(lp) * (lp - lq))), 0.0)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def agreement(full: Sequence[int], other: Sequence[int]) -> tuple[float, float]:
    """Position-wise and prefix agreement of ``other`` with ``full``: the
    share of ``full``'s positions holding the same token in ``other``, and
    the share before their first difference (1.0 both for an empty ``full``).

    ``agreement([1, 2, 3, 4], [1, 9, 3]) -> (0.5, 0.25)``
    """
    if not full:
        return 1.0, 1.0
    same = [i < len(other) and other[i] == t for i, t in enumerate(full)]
    first = same.index(False) if False in same else len(full)
    return sum(same) / len(full), first / len(full)



def splice_summary(rows: Sequence[dict], fresh: Sequence[int]) -> dict[str, object]:
    """Per R: mean agreement, prefix agreement and KL, TTFT p50 cold and
    warm; and the default R (the smallest whose agreement reaches 0.95
    while something is still spliced and the warm TTFT beats the cold one:
    an R past every passage's length agrees fully because it splices nothing)."""
    table = []
    for r in fresh:
        mine = [row for row in rows if row["fresh"] == r]
        table.append({
            "fresh": r, "questions": len(mine), "agreement": round(mean(x["agreement"] for x in mine), 4),
            "prefix_agreement": round(mean(x["prefix_agreement"] for x in mine), 4),
            "kl": round(mean(x["kl"] for x in mine), 5),
            "ttft_cold_p50_s": percentile([x["ttft_cold_s"] for x in mine], 0.5),
            "ttft_warm_p50_s": percentile([x["ttft_warm_s"] for x in mine], 0.5),
            "spliced_tokens": round(mean(x["spliced_tokens"] for x in mine), 1),
            "passages_found": round(mean(x["passages_found"] / max(x["passages"], 1) for x in mine), 3),
        })
    ok = [row for row in table if row["questions"] and row["agreement"] >= AGREEMENT and row["spliced_tokens"] > 0
          and row["ttft_warm_p50_s"] < row["ttft_cold_p50_s"]]
    default = ok[0] if ok else None
    return {"per_r": table, "default_r": default["fresh"] if default else None,
            "agreement_at_default": default["agreement"] if default else None,
            "timings_hold": all(row["timings_hold"] for row in rows)}
