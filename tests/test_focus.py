"""Cutting passages to their best window under a tight budget (pure logic)."""

from __future__ import annotations

from prompt_budget import BudgetRequest
from prompt_budget.budgeter import passage_room
from prompt_budget.focus import MIN_FOCUS_TOKENS, best_window, focus_cap


def test_cap_only_when_fewer_than_three_whole_chunks_fit():
    assert focus_cap(2000, 190) is None
    assert focus_cap(570, 190) is None
    assert focus_cap(270, 190) == 90
    # Too little room to cut three ways: two windows, then none.
    assert focus_cap(150, 190) == 75 and focus_cap(150, 190) >= MIN_FOCUS_TOKENS // 2
    assert focus_cap(100, 190) is None


def test_best_window_is_the_highest_scoring_run_that_fits():
    assert best_window([0, 1, 3, 0], [5, 5, 5, 5], 10) == (1, 3)
    assert best_window([0, 0, 0], [5, 5, 5], 10) == (0, 2)  # no match: the head, as long as fits
    assert best_window([2, 0, 2], [4, 20, 4], 10) == (0, 1)  # a long middle unit breaks the run
    assert best_window([1, 1], [30, 30], 10) == (0, 0)  # nothing fits alone


def test_passage_room_follows_the_target_and_the_window():
    linear = lambda new, cached: new / 100.0  # 100 tokens a second
    base = dict(fixed_tokens=100, n_ctx=4096, reserve_tokens=96, cached_tokens=100, overhead_s=0.5, safety=1.0)
    assert passage_room(BudgetRequest(target_ttft=2.5, **base), linear) == 200
    assert passage_room(BudgetRequest(target_ttft=0.4, **base), linear) == 0
    assert passage_room(BudgetRequest(target_ttft=None, **base), linear) == 4096 - 96 - 100
