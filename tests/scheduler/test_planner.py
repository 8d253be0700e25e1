"""The batch planner: a pure function of the queue, the policy and the time."""

from __future__ import annotations

from dataclasses import dataclass

from modelsvc.scheduler import BatchPolicy, Plan, plan_batch

MS = 1_000_000


@dataclass
class Req:
    batch_size: int = 1
    shape_key: object = "a"
    enqueued_ns: int = 0


def test_empty_queue_waits_for_arrivals():
    assert plan_batch([], BatchPolicy(8), 0) == Plan(0, None)


def test_no_delay_sends_what_is_queued():
    q = [Req(), Req(), Req()]
    assert plan_batch(q, BatchPolicy(8), now_ns=0) == Plan(3)


def test_full_batch_goes_at_once_even_with_delay():
    q = [Req(2), Req(2), Req(4), Req(1)]
    assert plan_batch(q, BatchPolicy(8, max_queue_delay_ns=100 * MS), 0) == Plan(3)


def test_delay_waits_for_the_rest_of_the_oldest_requests_delay():
    q = [Req(enqueued_ns=0), Req(enqueued_ns=1 * MS)]
    plan = plan_batch(q, BatchPolicy(8, max_queue_delay_ns=5 * MS), now_ns=2 * MS)
    assert plan == Plan(0, 3 * MS)


def test_delay_over_sends_everything_gathered():
    q = [Req(enqueued_ns=0), Req(enqueued_ns=1 * MS)]
    assert plan_batch(q, BatchPolicy(8, max_queue_delay_ns=5 * MS), now_ns=5 * MS) == Plan(2)


def test_shape_mismatch_closes_the_batch():
    q = [Req(shape_key="x"), Req(shape_key="x"), Req(shape_key="y"), Req(shape_key="x")]
    assert plan_batch(q, BatchPolicy(8, max_queue_delay_ns=100 * MS), 0) == Plan(2)


def test_next_request_too_big_closes_the_batch():
    q = [Req(3), Req(3), Req(3)]
    assert plan_batch(q, BatchPolicy(8, max_queue_delay_ns=100 * MS), 0) == Plan(2)


def test_request_at_limit_goes_alone():
    assert plan_batch([Req(8), Req(1)], BatchPolicy(8, max_queue_delay_ns=100 * MS), 0) == Plan(1)


def test_preferred_size_reached_goes_now_cut_back_to_largest_preferred():
    policy = BatchPolicy(16, preferred_batch_sizes=(2, 4, 8), max_queue_delay_ns=100 * MS)
    q = [Req(), Req(), Req(), Req(), Req()]  # 5 queued: 4 is the largest preferred reached
    assert plan_batch(q, policy, 0) == Plan(4)


def test_preferred_limit_caps_batch_growth():
    policy = BatchPolicy(16, preferred_batch_sizes=(4,), max_queue_delay_ns=100 * MS)
    q = [Req() for _ in range(10)]
    assert plan_batch(q, policy, 0) == Plan(4)


def test_no_preferred_reached_waits_then_sends_all():
    policy = BatchPolicy(16, preferred_batch_sizes=(4, 8), max_queue_delay_ns=10 * MS)
    q = [Req(), Req(), Req()]
    assert plan_batch(q, policy, now_ns=1 * MS) == Plan(0, 9 * MS)
    assert plan_batch(q, policy, now_ns=10 * MS) == Plan(3)


def test_planner_stops_reading_the_queue_early():
    policy = BatchPolicy(4)

    def endless():
        while True:
            yield Req()

    assert plan_batch(endless(), policy, 0) == Plan(4)
