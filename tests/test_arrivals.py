"""Questions on their way and the rate of those that come while others are
answered: pure logic, on an injected clock."""

from __future__ import annotations

import pytest

from rag.qa.arrivals import Arrivals


def test_one_user_asking_in_turn_leaves_no_room_for_itself():
    arrivals = Arrivals(window_s=10.0)
    for t in range(5):
        with arrivals.arrive(now=float(t)) as arrival:
            arrival.planned()
    assert arrivals.expected(2.0, now=5.0) == 0.0
    assert arrivals.unplanned == arrivals.open == 0


def test_questions_asked_while_others_are_answered_are_expected_at_their_recent_rate():
    arrivals = Arrivals(window_s=10.0)
    first = arrivals.arrive(now=0.0)
    others = [arrivals.arrive(now=0.1 * i) for i in range(1, 5)]  # four more while the first is open
    assert arrivals.unplanned == 5 and arrivals.open == 5
    assert arrivals.expected(2.0, now=1.0) == pytest.approx(4 / 10.0 * 2.0)
    assert arrivals.expected(2.0, now=11.0) == 0.0  # forgotten once out of the window
    for arrival in (first, *others):
        arrival.planned()
        arrival.planned()  # counted once however often it is said
    assert arrivals.unplanned == 0 and arrivals.open == 5
    for arrival in (first, *others):
        arrival.close()
        arrival.close()
    assert arrivals.open == 0


def test_a_question_that_ends_before_it_is_planned_is_no_longer_on_its_way():
    arrivals = Arrivals()
    with arrivals.arrive(now=0.0):
        assert arrivals.unplanned == 1
    assert arrivals.unplanned == arrivals.open == 0


def test_overlapping_arrivals_are_forgotten_without_a_plan_asking_for_them():
    # Questions without a deadline never ask expected(): what they leave must still be pruned.
    arrivals = Arrivals(window_s=10.0)
    held = arrivals.arrive(now=0.0)  # one long answer: every later question overlaps it
    for i in range(1, 5001):
        with arrivals.arrive(now=i * 0.1) as arrival:
            arrival.planned()
    # Only the last window's arrivals (10 s at one each 0.1 s) are remembered, not all 5000.
    assert len(arrivals._overlapping) <= 101
    held.close()
