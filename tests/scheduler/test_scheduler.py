"""The scheduler with instances the test controls: every ordering is decided by events, not sleeps."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from modelsvc.protocol import Unavailable
from modelsvc.scheduler import (
    BatchPolicy,
    DynamicScheduler,
    ModelStats,
    QueuePolicy,
    SchedulerConfig,
    TimeoutAction,
    WorkItem,
)

WAIT = 10.0  # generous bound for "eventually"; a pass never waits this long


class GatedInstance:
    """Doubles IN; blocks in execute until its gate opens. Records every batch it ran."""

    def __init__(self, name: str = "inst", barrier: threading.Barrier | None = None) -> None:
        self.name = name
        self.device = "cpu"
        self.providers = ["test"]
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[float]] = []
        self.barrier = barrier
        self.closed = False

    def execute(self, inputs, output_names):
        self.entered.set()
        if self.barrier is not None:
            self.barrier.wait(timeout=WAIT)
        assert self.gate.wait(WAIT), "test never opened the gate"
        self.batches.append(inputs["IN"][:, 0].tolist())
        return {"OUT": inputs["IN"] * 2}

    def close(self) -> None:
        self.closed = True


def config(**kw) -> SchedulerConfig:
    base = {
        "batching": True,
        "dynamic": True,
        "batch": BatchPolicy(8),
    }
    base.update(kw)
    return SchedulerConfig(**base)


def row(v: float, n: int = 1) -> dict[str, np.ndarray]:
    return {"IN": np.full((n, 2), v, dtype=np.float32)}


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def started(inst: GatedInstance) -> None:
    await until(inst.entered.is_set, "the instance to start a batch")


@pytest.fixture
def stats() -> ModelStats:
    return ModelStats("m", "1")


async def test_requests_queued_behind_a_busy_instance_form_one_batch(stats):
    inst = GatedInstance()
    s = DynamicScheduler(config(), [inst], stats)
    s.start()
    first = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
    await started(inst)
    rest = [asyncio.ensure_future(s.enqueue(WorkItem(row(v), ["OUT"]))) for v in (2, 3, 4)]
    await until(lambda: s.pending_count == 3, "three queued")
    inst.gate.set()
    outs = await asyncio.gather(first, *rest)
    assert [o["OUT"][0, 0] for o in outs] == [2, 4, 6, 8]
    assert inst.batches == [[1], [2, 3, 4]]
    assert stats.execution_count == 2
    assert stats.inference_count == 4
    assert sorted(stats.batches) == [1, 3]
    await s.close()
    assert inst.closed


async def test_unbatched_scheduler_runs_each_request_alone(stats):
    inst = GatedInstance()
    s = DynamicScheduler(config(dynamic=False), [inst], stats)
    s.start()
    inst.gate.set()
    outs = await asyncio.gather(*(s.enqueue(WorkItem(row(v, n=2), ["OUT"])) for v in (1, 2, 3)))
    assert [o["OUT"].shape for o in outs] == [(2, 2)] * 3
    assert len(inst.batches) == 3
    await s.close()


async def test_timeout_rejects_while_the_instance_is_still_busy(stats):
    """The rejection comes from the request's own timer, not from the scheduler waking up."""
    policy = QueuePolicy(default_timeout_ns=50_000_000)
    inst = GatedInstance()
    s = DynamicScheduler(config(policies=(policy,)), [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
    await started(inst)
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="timeout expired"):
        await s.enqueue(WorkItem(row(2), ["OUT"]))
    waited = time.monotonic() - t0
    assert waited >= 0.05
    assert not inst.gate.is_set()  # the instance never freed up: the timer alone rejected it
    assert s.pending_count == 0
    inst.gate.set()
    await busy
    await s.close()
    assert inst.batches == [[1]]


async def test_request_timeout_override_only_shortens(stats):
    policy = QueuePolicy(default_timeout_ns=10_000_000_000, allow_timeout_override=True)
    assert policy.timeout_ns(20_000) == 20_000_000
    assert policy.timeout_ns(None) == 10_000_000_000
    assert policy.timeout_ns(60_000_000) == 10_000_000_000
    assert QueuePolicy(default_timeout_ns=5).timeout_ns(1) == 5  # override not allowed


async def test_delay_action_moves_expired_request_behind_the_others(stats):
    policy = QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_ns=0, allow_timeout_override=True)
    inst = GatedInstance()
    s = DynamicScheduler(config(batch=BatchPolicy(1), policies=(policy,)), [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    late = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"], timeout_us=1_000)))
    await until(lambda: s.pending_count == 1 and not s._levels[0], "the timeout to move the request")
    other = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["OUT"])))
    await until(lambda: s.pending_count == 2, "two queued")
    inst.gate.set()
    await asyncio.gather(busy, late, other)
    assert inst.batches == [[0], [2], [1]]
    await s.close()


async def test_full_queue_rejects_at_once(stats):
    inst = GatedInstance()
    s = DynamicScheduler(config(policies=(QueuePolicy(max_queue_size=2),)), [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    queued = [asyncio.ensure_future(s.enqueue(WorkItem(row(v), ["OUT"]))) for v in (1, 2)]
    await until(lambda: s.pending_count == 2, "two queued")
    with pytest.raises(Unavailable, match="maximum queue size of 2"):
        await s.enqueue(WorkItem(row(3), ["OUT"]))
    inst.gate.set()
    await asyncio.gather(busy, *queued)
    await s.close()


async def test_request_whose_caller_left_never_runs(stats):
    inst = GatedInstance()
    s = DynamicScheduler(config(), [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    gone = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
    stays = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["OUT"])))
    await until(lambda: s.pending_count == 2, "two queued")
    gone.cancel()
    await until(lambda: s.pending_count == 1, "the cancelled request to leave")
    inst.gate.set()
    await asyncio.gather(busy, stays)
    assert inst.batches == [[0], [2]]
    await s.close()


async def test_higher_priority_goes_first(stats):
    inst = GatedInstance()
    cfg = config(
        batch=BatchPolicy(1),
        priority_levels=2,
        default_priority=2,
        policies=(QueuePolicy(), QueuePolicy()),
    )
    s = DynamicScheduler(cfg, [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    low = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))  # default level 2
    high = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["OUT"], priority=1)))
    await until(lambda: s.pending_count == 2, "two queued")
    inst.gate.set()
    await asyncio.gather(busy, low, high)
    assert inst.batches == [[0], [2], [1]]
    await s.close()


async def test_two_instances_execute_at_the_same_time(stats):
    barrier = threading.Barrier(2)  # each execute waits here for the other: passes only in parallel
    a, b = GatedInstance("a", barrier), GatedInstance("b", barrier)
    a.gate.set()
    b.gate.set()
    s = DynamicScheduler(config(batch=BatchPolicy(1)), [a, b], stats)
    s.start()
    await asyncio.gather(s.enqueue(WorkItem(row(1), ["OUT"])), s.enqueue(WorkItem(row(2), ["OUT"])))
    assert len(a.batches) == 1
    assert len(b.batches) == 1
    await s.close()


async def test_preserve_ordering_holds_later_results(stats):
    a, b = GatedInstance("a"), GatedInstance("b")
    s = DynamicScheduler(config(batch=BatchPolicy(1), preserve_ordering=True), [a, b], stats)
    s.start()
    first = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
    await started(a)
    second = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["OUT"])))
    await started(b)
    b.gate.set()
    await until(lambda: len(b.batches) == 1, "b to finish")
    await asyncio.sleep(0.01)  # give a wrongly released result the chance to show
    assert not second.done()
    a.gate.set()
    assert (await first)["OUT"][0, 0] == 2
    assert (await second)["OUT"][0, 0] == 4
    await s.close()


async def test_close_finishes_queued_work_and_refuses_new(stats):
    inst = GatedInstance()
    s = DynamicScheduler(config(), [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    queued = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
    await until(lambda: s.pending_count == 1, "one queued")
    closing = asyncio.ensure_future(s.close())
    await asyncio.sleep(0)
    with pytest.raises(Unavailable, match="shutting down"):
        await s.enqueue(WorkItem(row(2), ["OUT"]))
    inst.gate.set()
    await closing
    assert (await queued)["OUT"][0, 0] == 2
    await busy


async def test_execution_failure_fails_only_that_batch(stats):
    class Failing(GatedInstance):
        def execute(self, inputs, output_names):
            if inputs["IN"][0, 0] < 0:
                raise RuntimeError("boom")
            return super().execute(inputs, output_names)

    inst = Failing()
    inst.gate.set()
    s = DynamicScheduler(config(), [inst], stats)
    s.start()
    with pytest.raises(Exception, match="failed to execute") as info:
        await s.enqueue(WorkItem(row(-1), ["OUT"]))
    assert "boom" not in str(info.value)
    assert (await s.enqueue(WorkItem(row(3), ["OUT"])))["OUT"][0, 0] == 6
    await s.close()


async def test_delayed_request_keeps_its_priority_level(stats):
    """A DELAY-expired level-1 request goes behind level 1's other requests, but before level 2."""
    delay = QueuePolicy(timeout_action=TimeoutAction.DELAY, allow_timeout_override=True)
    cfg = config(batch=BatchPolicy(1), priority_levels=2, default_priority=2, policies=(delay, QueuePolicy()))
    inst = GatedInstance()
    s = DynamicScheduler(cfg, [inst], stats)
    s.start()
    busy = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await started(inst)
    late = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"], priority=1, timeout_us=1_000)))
    await until(lambda: not s._levels[0] and s.pending_count == 1, "the request to be delayed")
    low = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["OUT"])))
    await until(lambda: s.pending_count == 2, "two queued")
    inst.gate.set()
    await asyncio.gather(busy, late, low)
    assert inst.batches == [[0], [1], [2]]
    await s.close()


async def test_failing_start_hook_loses_neither_batch_nor_instance(stats):
    inst = GatedInstance()
    inst.gate.set()
    s = DynamicScheduler(config(), [inst], stats)
    s.start()

    def broken(rows: int) -> None:
        raise RuntimeError("hook failed")

    assert (await s.enqueue(WorkItem(row(1), ["OUT"], on_start=broken)))["OUT"][0, 0] == 2
    assert (await s.enqueue(WorkItem(row(2), ["OUT"])))["OUT"][0, 0] == 4
    await s.close()


async def test_close_without_start_releases_instances(stats):
    inst = GatedInstance()
    await DynamicScheduler(config(), [inst], stats).close()
    assert inst.closed



class _EarlyTimersLoop(asyncio.SelectorEventLoop):
    """An event loop whose timers fire 2 ms early. uvloop's count whole milliseconds off libuv's
    clock, which can put them a fraction of a millisecond ahead of time.monotonic (seen in CI)."""

    def call_later(self, delay, callback, *args, context=None):
        return super().call_later(max(0.0, delay - 0.002), callback, *args, context=context)


def test_timeout_never_fires_before_its_deadline_when_the_loop_timer_is_early(stats):
    timeout_ns = 5_000_000

    async def main() -> list[int]:
        inst = GatedInstance()
        s = DynamicScheduler(config(policies=(QueuePolicy(default_timeout_ns=timeout_ns),)), [inst], stats)
        s.start()
        busy = asyncio.ensure_future(s.enqueue(WorkItem(row(1), ["OUT"])))
        await started(inst)
        waits = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            with pytest.raises(Unavailable, match="timeout expired"):
                await s.enqueue(WorkItem(row(2), ["OUT"]))
            waits.append(time.perf_counter_ns() - t0)
        inst.gate.set()
        await busy
        await s.close()
        return waits

    with asyncio.Runner(loop_factory=_EarlyTimersLoop) as runner:
        waits = runner.run(main())
    assert min(waits) >= timeout_ns, f"timed out after {min(waits) / 1e6:.3f} ms, before the 5 ms timeout"


async def test_a_full_batch_goes_at_once_whatever_the_queue_delay(stats):
    inst = GatedInstance()
    inst.gate.set()
    sched = DynamicScheduler(config(batch=BatchPolicy(4, max_queue_delay_ns=600 * 10**9)), [inst], stats)
    sched.start()
    try:
        t0 = time.monotonic()
        calls = [sched.enqueue(WorkItem(row(i), ["OUT"])) for i in range(4)]
        outs = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
        assert time.monotonic() - t0 < WAIT
        assert [o["OUT"][0, 0] for o in outs] == [0, 2, 4, 6]
        assert inst.batches == [[0, 1, 2, 3]]
    finally:
        await sched.close()


async def test_a_lone_request_waits_out_the_queue_delay_then_goes(stats):
    """The delay runs on the batch timer (a timerfd on Linux): a request that cannot fill a batch waits the delay
    (less the timer's wake-up lead, at most 60 us) and then goes alone, without any other event to wake the scheduler;
    the lead it learns stays within its bounds."""
    inst = GatedInstance()
    inst.gate.set()
    delay_ns = 30_000_000
    sched = DynamicScheduler(config(batch=BatchPolicy(8, max_queue_delay_ns=delay_ns)), [inst], stats)
    sched.start()
    try:
        t0 = time.perf_counter_ns()
        out = await asyncio.wait_for(sched.enqueue(WorkItem(row(5), ["OUT"])), WAIT)
        waited = time.perf_counter_ns() - t0
        assert out["OUT"][0, 0] == 10
        assert inst.batches == [[5]]
        assert waited >= delay_ns - 60_000
        queue_ns = stats.as_json()["inference_stats"]["queue"]["ns"]
        assert queue_ns >= delay_ns - 60_000
        for _ in range(3):
            await asyncio.wait_for(sched.enqueue(WorkItem(row(1), ["OUT"])), WAIT)
        assert 0 <= sched._lead_ns <= 60_000
    finally:
        await sched.close()
