"""The routing policy of a pool of engines: pure decisions, no engine."""

from __future__ import annotations

import pytest

from engine.remote.routing import POLICIES, Decision, EngineView, check_policy, choose

A, B, C = 0, 1, 2


def views(*rows):
    return [EngineView(key, cached, ttft, in_flight, last_used) for key, cached, ttft, in_flight, last_used in rows]


def test_affinity_goes_to_the_engine_holding_the_longest_prefix():
    pool = views((A, 900, 2.5, 1, 5), (B, 100, 1.2, 0, 3))
    assert choose(pool, "affinity", budget_s=3.0) == Decision(A, "affinity", "longest prefix")
    assert choose(pool, "affinity", budget_s=None).key == A  # no deadline: the cache wins


def test_affinity_leaves_its_engine_only_when_that_misses_the_deadline_and_another_meets_it():
    pool = views((A, 900, 2.5, 3, 5), (B, 100, 1.2, 0, 3), (C, 100, 1.9, 0, 1))
    assert choose(pool, "affinity", budget_s=2.0) == Decision(B, "affinity", "deadline")
    # Nobody meets 1.0 s: the cached prefix still makes A the best bet.
    assert choose(pool, "affinity", budget_s=1.0) == Decision(A, "affinity", "longest prefix")


def test_with_no_engine_ahead_in_cache_the_earliest_first_token_wins():
    pool = views((A, 100, 1.5, 1, 5), (B, 100, 0.8, 0, 6), (C, 100, 0.8, 0, 2))
    # B and C tie on time: the one used longest ago.
    assert choose(pool, "affinity", budget_s=2.0) == Decision(C, "affinity", "earliest first token")


def test_among_engines_holding_the_same_longest_prefix_the_sooner_one_is_chosen():
    pool = views((A, 500, 1.5, 1, 5), (B, 500, 0.9, 0, 6), (C, 10, 0.1, 0, 1))
    assert choose(pool, "affinity", budget_s=2.0) == Decision(B, "affinity", "longest prefix")


def test_round_robin_and_least_loaded_ignore_the_cache():
    pool = views((B, 900, 2.0, 2, 7), (A, 0, 1.0, 0, 9), (C, 0, 1.0, 0, 4))
    assert [choose(pool, "round_robin", budget_s=None, turn=t).key for t in range(4)] == [A, B, C, A]
    assert choose(pool, "least_loaded", budget_s=None) == Decision(C, "least_loaded", "least loaded")


def test_bad_input_is_refused():
    assert set(POLICIES) == {"affinity", "round_robin", "least_loaded"}
    with pytest.raises(ValueError, match="unknown routing policy"):
        check_policy("random")
    with pytest.raises(ValueError, match="no engine"):
        choose([], "affinity", budget_s=None)


def test_a_session_returns_to_its_engine_when_no_engine_holds_more_of_its_prompt():
    pool = [EngineView(A, 100, 1.5, 0, 1), EngineView(B, 100, 0.9, 0, 2, home=False),
            EngineView(C, 100, 1.2, 0, 3, home=True)]
    assert choose(pool, "affinity", budget_s=2.0) == Decision(C, "affinity", "session's engine")
    # ... unless its engine would miss the deadline.
    assert choose(pool, "affinity", budget_s=1.0) == Decision(B, "affinity", "earliest first token")
