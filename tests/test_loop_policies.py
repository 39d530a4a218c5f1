"""The engine loop's pure decisions: when warming gives way, and what a
streak of failures outside a step leads to."""

from __future__ import annotations

import pytest

from engine.errors import ContextOverflow, GenerationFailed
from engine.llama_cpp.recovery import LOOP_FAILURES, FailureStreak, told_error
from engine.llama_cpp.requests import Active, Request
from engine.llama_cpp.warming import warming_turn


def _request(idle: bool) -> Request:
    return Request(0, [1, 2, 3], 0, idle=idle)


def _active(idle: bool) -> Active:
    return Active(_request(idle), seq=1, reserved=4, next=0, n_past=0, cached=0)


def test_warming_gives_way_to_any_other_request_running_or_waiting():
    warm_running, warm_waiting = _active(True), _request(True)
    turn = warming_turn([warm_running], [warm_waiting, _request(False)])
    assert turn.stop == [warm_running] and turn.unqueue == [warm_waiting] and not turn.start
    turn = warming_turn([warm_running, _active(False)], [])
    assert turn.stop == [warm_running] and turn.unqueue == [] and not turn.start


def test_warming_starts_only_on_an_engine_that_holds_and_awaits_nothing():
    assert warming_turn([], []).start
    assert not warming_turn([_active(True)], []).start  # one is warming already
    assert not warming_turn([], [_request(True)]).start
    assert warming_turn([_active(True)], []).stop == []  # nothing to give way to


def test_a_streak_of_failures_tells_the_waiting_at_its_limit_and_raises_past_it():
    streak = FailureStreak()
    assert not streak.recovering
    for count in range(1, LOOP_FAILURES + 1):
        streak.failed(RuntimeError(count))
        assert streak.recovering and streak.tell_waiting == (count == LOOP_FAILURES)
    with pytest.raises(RuntimeError):
        streak.failed(RuntimeError("once more"))
    streak.passed()
    assert not streak.recovering and streak.last is None


def test_a_request_is_told_an_engine_error_as_it_is_and_anything_else_by_name():
    overflow = ContextOverflow("too long")
    assert told_error(overflow) is overflow
    told = told_error(KeyError("slot"))
    assert isinstance(told, GenerationFailed) and "KeyError" in str(told)
