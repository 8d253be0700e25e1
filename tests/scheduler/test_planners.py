"""What every planner (each way of forming batches, ``modelsvc.scheduler.PLANNERS``) must keep, whatever its rules.

A planner is pure: these tests drive it with a simulated queue and simulated time, no clock, no event loop, no
server. The queue is kept as the scheduler keeps it (priority level 1 first, arrival order within a level,
timed-out requests removed at their deadline, the requests a ``Plan`` names taken as one batch), and every
run is checked: no batch over max_batch_size, the oldest request of the highest waiting priority in every batch,
every request sent once or timed out (none lost, none duplicated), no timed-out request batched, and a queue
past every delay always goes. The dynamic batcher also keeps FIFO within a priority (a batch is a prefix of the
queue); the padding-aware batcher keeps max_batch_tokens (a request over it alone) and never pads beyond the
largest of pad_buckets, nor shorter than the batch's longest request. A new planner adds its configs to
``PLANNERS_UNDER_TEST``; its own rules get their own tests (test_planner.py for the dynamic batcher,
test_padded_planner.py for the padding-aware one).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modelsvc.scheduler import PLANNERS, PaddedPolicy, Plan, Planner

MAX_BATCH_SIZE = 8
US = 1_000
FOREVER_NS = 10**18

MAX_LENGTH = 64
PADDED = """
input [ { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }, { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "hidden" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "pooled" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def pad_parameters(buckets: str = "", tokens: int = 0) -> str:
    params = {"pad_inputs": "ids:0=0,mask:0=0", "pad_outputs": "hidden:0", "pad_buckets": buckets}
    if tokens:
        params["max_batch_tokens"] = str(tokens)
    return "".join(f'\nparameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items() if v)


#: for each registered planner, model configs that choose it (max_batch_size is MAX_BATCH_SIZE)
PLANNERS_UNDER_TEST: dict[str, list[str]] = {
    "dynamic_batching": [
        "dynamic_batching { }",
        "dynamic_batching { max_queue_delay_microseconds: 500 }",
        "dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 300 }",
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 2000 priority_levels: 3 }",
    ],
    "pad_inputs": [
        PADDED + "dynamic_batching { }" + pad_parameters(),
        PADDED + "dynamic_batching { max_queue_delay_microseconds: 500 }" + pad_parameters(buckets="16,32,64"),
        PADDED + "dynamic_batching { max_queue_delay_microseconds: 300 }" + pad_parameters(tokens=96),
        PADDED
        + "dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 2000 priority_levels: 3 }"
        + pad_parameters(buckets="8,64", tokens=128),
    ],
}
CASES = [(name, text) for name, texts in PLANNERS_UNDER_TEST.items() for text in texts]


@dataclass(eq=False)
class Req:
    """A queued request as a planner sees it (``Queued``), plus what the simulation needs."""

    id: int
    level: int
    batch_size: int
    shape_key: object
    enqueued_ns: int
    deadline_ns: int | None
    length: int = 0


@dataclass
class Run:
    batches: list[list[Req]]
    timed_out: list[Req]


def planner(name: str, text: str) -> Planner:
    config = text_format.Parse(f'name: "m"\nmax_batch_size: {MAX_BATCH_SIZE}\n{text}', model_config_pb2.ModelConfig())
    made = PLANNERS[name](config)
    assert made is not None, f"{name} does not accept its own config: {text}"
    return made


def workload(seed: int) -> list[Req]:
    rng = random.Random(seed)
    t = 0
    requests = []
    for i in range(60):
        t += rng.choice([0, 0, 50, 200, 700, 3000]) * US // 10
        timeout = rng.choice([None, None, None, 100 * US, 1000 * US])
        requests.append(
            Req(
                id=i,
                level=rng.choice([1, 1, 2, 3]),
                batch_size=rng.choice([1, 1, 1, 2, 3, MAX_BATCH_SIZE]),
                shape_key=rng.choice(["a", "a", "b"]),
                enqueued_ns=t,
                deadline_ns=None if timeout is None else t + timeout,
                length=round(math.exp(rng.uniform(0, math.log(MAX_LENGTH)))),
            )
        )
    return requests


def simulate(plan_fn: Planner, requests: list[Req]) -> Run:
    """Run the queue as the scheduler does, with as many free instances as batches."""
    arrivals = sorted(requests, key=lambda r: r.enqueued_ns)
    levels: dict[int, list[Req]] = {1: [], 2: [], 3: []}
    run = Run([], [])
    now = 0
    draining = False
    for _ in range(10_000):
        while arrivals and arrivals[0].enqueued_ns <= now:
            req = arrivals.pop(0)
            levels[req.level].append(req)
        for queue in levels.values():
            for req in [r for r in queue if r.deadline_ns is not None and r.deadline_ns <= now and not draining]:
                queue.remove(req)
                run.timed_out.append(req)
        snapshot = [r for level in sorted(levels) for r in levels[level]]
        plan = plan_fn.plan(iter(snapshot), now + (FOREVER_NS if draining else 0))
        assert isinstance(plan, Plan)
        assert 0 <= plan.take <= len(snapshot), (plan, len(snapshot))
        if plan.take:
            positions = plan.positions()
            assert len(positions) == plan.take == len(set(positions)), plan
            assert list(positions) == sorted(positions), plan
            assert positions[-1] < len(snapshot), plan
            batch = [snapshot[i] for i in positions]
            check_batch(plan_fn, plan, batch, snapshot)
            for req in batch:
                levels[req.level].remove(req)
            run.batches.append(batch)
            continue
        if not snapshot and not arrivals:
            return run
        if draining:
            pytest.fail(f"the queue holds {len(snapshot)} requests past every delay, and the planner waits")
        upcoming = [r.enqueued_ns for r in arrivals[:1]]
        upcoming += [r.deadline_ns for r in snapshot if r.deadline_ns is not None]
        if plan.wait_ns is not None:
            assert plan.wait_ns > 0, plan
            upcoming.append(now + plan.wait_ns)
        if upcoming:
            now = max(now, min(upcoming))
        else:
            draining = True  # nothing will arrive: drain as the scheduler does when it closes
    pytest.fail("the simulation did not end")


def check_batch(planner: Planner, plan: Plan, batch: list[Req], waiting: list[Req]) -> None:
    assert sum(r.batch_size for r in batch) <= MAX_BATCH_SIZE, [r.batch_size for r in batch]
    head = min(waiting, key=lambda r: (r.level, r.enqueued_ns, r.id))
    assert head in batch, "a batch went while the highest-priority, oldest request waited"
    if isinstance(planner, PaddedPolicy):
        assert len({r.shape_key for r in batch}) == 1, "requests of other shapes share a padded batch"
        assert plan.pad_to is not None, plan
        assert plan.pad_to >= max(r.length for r in batch), "a batch padded shorter than its longest request"
        if planner.spec.buckets:
            assert plan.pad_to in planner.spec.buckets, (plan.pad_to, planner.spec.buckets)
        budget = planner.spec.max_batch_tokens
        if budget and len(batch) > 1:
            assert sum(r.batch_size for r in batch) * plan.pad_to <= budget, "a batch over max_batch_tokens"
        return
    assert plan.pad_to is None, plan
    left = [r for r in waiting if r not in batch]
    if left:
        last_sent = max((r.level, r.enqueued_ns, r.id) for r in batch)
        first_left = min((r.level, r.enqueued_ns, r.id) for r in left)
        assert last_sent < first_left, "a request went before one of a higher priority, or an older one of its level"


def test_every_registered_planner_is_under_test() -> None:
    assert set(PLANNERS) == set(PLANNERS_UNDER_TEST)


@pytest.mark.parametrize(("name", "text"), CASES, ids=[f"{n}:{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("seed", range(12))
def test_planner_keeps_the_invariants(name: str, text: str, seed: int) -> None:
    requests = workload(seed)
    run = simulate(planner(name, text), requests)

    sent = [r for batch in run.batches for r in batch]
    assert len({r.id for r in sent}) == len(sent), "a request was batched twice"
    assert not {r.id for r in sent} & {r.id for r in run.timed_out}, "a timed-out request was batched"
    assert sorted(r.id for r in sent + run.timed_out) == [r.id for r in requests], "a request was lost"
    if name == "dynamic_batching":
        for level in (1, 2, 3):
            order = [r.enqueued_ns for r in sent if r.level == level]
            assert order == sorted(order), f"level {level} was not sent in arrival order"
    assert simulate(planner(name, text), requests).batches == run.batches, "the same queue gave other batches"


@pytest.mark.parametrize(("name", "text"), CASES, ids=[f"{n}:{i}" for i, (n, _) in enumerate(CASES)])
def test_planner_of_an_empty_queue_waits_for_arrivals(name: str, text: str) -> None:
    assert planner(name, text).plan(iter([]), 0) == Plan(0, None)


@pytest.mark.parametrize(("name", "text"), CASES, ids=[f"{n}:{i}" for i, (n, _) in enumerate(CASES)])
def test_planner_sends_a_lone_request_past_every_delay(name: str, text: str) -> None:
    req = Req(0, 1, 1, "a", enqueued_ns=0, deadline_ns=None, length=5)
    assert planner(name, text).plan(iter([req]), FOREVER_NS).take == 1


@pytest.mark.parametrize("text", PLANNERS_UNDER_TEST["pad_inputs"])
def test_the_padding_planner_batches_requests_of_different_lengths(text: str) -> None:
    runs = [simulate(planner("pad_inputs", text), workload(seed)) for seed in range(4)]
    mixed = [b for run in runs for b in run.batches if len({r.length for r in b}) > 1]
    assert mixed, "no batch held requests of different lengths"
