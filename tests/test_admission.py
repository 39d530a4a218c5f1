"""What a remote engine reports a new request meets (engine.remote.in_flight),
and the service's rate limiter: pure logic."""

from __future__ import annotations

from engine.remote.in_flight import InFlight
from rag.service.ratelimit import RateLimiter


def _holding(queue: InFlight, n: int) -> list:
    held = [queue.holding() for _ in range(n)]
    for h in held:
        h.__enter__()
    return held


def test_a_server_with_free_slots_makes_no_newcomer_wait():
    assert InFlight(parallel=1).ahead().wait_s == 0.0  # nothing in flight
    for parallel, wait in ((1, 4.0), (8, 0.0), (4, 0.25), (2, 1.5), (0, 4.0)):
        queue = InFlight(parallel=parallel, service_s=1.0)
        held = _holding(queue, 4)  # kept: a request dropped unread is no longer in flight
        assert queue.ahead().wait_s == wait and len(held) == 4, parallel  # 0 slots: one at a time


def test_the_time_a_request_holds_the_server_is_a_moving_average():
    queue = InFlight(parallel=1, service_s=1.0)
    first, second = _holding(queue, 2)
    first.__exit__(None, None, None)
    assert queue.count == 1 and 0.8 <= queue.service_s < 0.81  # the one that left took next to nothing


def test_the_wait_each_request_in_flight_adds_is_learned_from_the_servers_clock():
    queue = InFlight(parallel=8, service_s=1.0)
    held = _holding(queue, 4)
    assert queue.ahead().wait_s == 0.0  # the prior: a free slot, no wait
    queue.learn_wait(ahead=4, waited_s=2.0)  # but one sent behind four waited 2 s beyond its prefill
    assert queue.ahead().wait_s == 4 * 0.5
    queue.learn_wait(ahead=0, waited_s=9.0)  # alone: its wait is the network's, not the queue's
    assert queue.ahead().wait_s == 4 * 0.5
    for _ in range(30):  # the waits stop: the estimate follows them down
        queue.learn_wait(ahead=2, waited_s=-0.1)
    assert queue.ahead().wait_s < 0.01 and len(held) == 4


def test_holding_says_how_many_were_in_flight_before():
    queue = InFlight()
    with queue.holding() as first:
        with queue.holding() as second:
            assert (first, second, queue.count) == (0, 1, 2)
    assert queue.count == 0


def test_the_rate_limiter_keeps_a_bounded_number_of_callers():
    limiter = RateLimiter(per_minute=60, max_buckets=100)
    for i in range(1000):
        assert limiter.take(f"addr:10.0.{i // 250}.{i % 250}") == 0.0  # each new caller has its burst
    assert len(limiter) <= 100
    for _ in range(int(limiter.burst)):
        limiter.take("addr:1.2.3.4")
    assert limiter.take("addr:1.2.3.4") > 0  # its own burst is spent: it waits
