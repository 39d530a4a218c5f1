"""The service's admission policy and rate limiter: pure logic."""

from __future__ import annotations

from rag.service.admission import Admission, EngineQueue, admit
from rag.service.ratelimit import RateLimiter


def test_a_wait_within_the_target_is_admitted_and_planned_for():
    assert admit(0.5, 2.0, load_aware=True, reject_over_target=True) == Admission(True, expected_wait_s=0.5)
    assert admit(0.5, 2.0, load_aware=False, reject_over_target=True) == Admission(True, expected_wait_s=0.0)
    assert admit(99.0, None, load_aware=True, reject_over_target=True).admit  # no target: always served


def test_a_wait_over_the_target_is_refused_or_served_with_the_least_context():
    refused = admit(3.0, 2.0, load_aware=True, reject_over_target=True)
    assert not refused.admit and refused.retry_after_s == 1.0
    least = admit(3.0, 2.0, load_aware=True, reject_over_target=False)
    assert least.admit and least.least_context and least.expected_wait_s == 3.0
    assert admit(3.0, 2.0, load_aware=False, reject_over_target=True).admit  # not load-aware: the wait is unseen


def test_the_queue_predicts_a_wait_from_depth_and_service_time():
    queue = EngineQueue(service_s=1.0)
    queue.enter()
    queue.enter()
    assert queue.expected_wait() == 2.0
    queue.leave(3.0)
    assert queue.depth == 1 and queue.expected_wait() == 0.8 * 1.0 + 0.2 * 3.0


def test_the_rate_limiter_keeps_a_bounded_number_of_callers():
    limiter = RateLimiter(per_minute=60, max_buckets=100)
    for i in range(1000):
        assert limiter.take(f"addr:10.0.{i // 250}.{i % 250}") == 0.0  # each new caller has its burst
    assert len(limiter) <= 100
    for _ in range(int(limiter.burst)):
        limiter.take("addr:1.2.3.4")
    assert limiter.take("addr:1.2.3.4") > 0  # its own burst is spent: it waits


def test_a_server_with_free_slots_makes_no_newcomer_wait():
    queue = EngineQueue(service_s=1.0)
    for _ in range(4):
        queue.enter()
    assert queue.expected_wait() == 4.0  # one at a time: behind all four
    assert queue.expected_wait(parallel=8) == 0.0  # eight slots, four busy: a free one
    assert queue.expected_wait(parallel=4) == 0.25  # all four busy: the first to finish, of four
    assert queue.expected_wait(parallel=2) == 1.5  # three ahead of it, two at a time
    assert queue.expected_wait(parallel=0) == 4.0  # nonsense is one at a time


def test_the_wait_each_request_ahead_adds_is_learned_from_answers():
    queue = EngineQueue(service_s=1.0)
    for _ in range(4):
        queue.enter()
    assert queue.expected_wait(parallel=8) == 0.0  # the prior: a free slot, no wait
    queue.learn_wait(ahead=4, waited_s=2.0)  # but an answer behind four waited 2 s beyond its idle prediction
    assert queue.expected_wait(parallel=8) == 4 * 0.5
    queue.learn_wait(ahead=0, waited_s=9.0)  # alone: its miss is the prediction's, not the queue's
    assert queue.expected_wait() == 4 * 0.5
    for _ in range(30):  # the waits stop: the estimate follows them down
        queue.learn_wait(ahead=2, waited_s=-0.1)
    assert queue.expected_wait() < 0.01
