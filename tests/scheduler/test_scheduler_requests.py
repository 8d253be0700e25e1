"""The scheduler with an instance that takes a batch as the list of its requests (``execute_requests``).

Batches form exactly as for concatenating instances; what changes is the hand-over: each request keeps
its own tensors, output names and data-plane request, and each answer (or error) goes to its request alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from modelsvc.backends import Arrays, BatchRequest
from modelsvc.protocol import InferRequest, InternalError, InvalidArgument
from modelsvc.scheduler import BatchPolicy, DynamicScheduler, ModelStats, SchedulerConfig, WorkItem

WAIT = 10.0


class ListInstance:
    """Blocks until its gate opens, then answers each request from its value: doubled; a negative value
    fails with InvalidArgument, 99 with an unexpected error. Records every list it was given."""

    def __init__(self) -> None:
        self.name = "list"
        self.device = "cpu"
        self.providers = ["test"]
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[BatchRequest]] = []
        self.raise_for_batch: BaseException | None = None
        self.answers: Callable[[Sequence[BatchRequest]], list[Any]] | None = None
        self.closed = False

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        raise AssertionError("the scheduler must hand this instance lists of requests")

    def execute_requests(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]:
        self.entered.set()
        assert self.gate.wait(WAIT), "test never opened the gate"
        self.batches.append(list(batch))
        if self.raise_for_batch is not None:
            raise self.raise_for_batch
        if self.answers is not None:
            return self.answers(batch)
        out: list[Arrays | BaseException] = []
        for item in batch:
            value = float(item.inputs["IN"][0, 0])
            if value < 0:
                out.append(InvalidArgument(f"negative input {value}"))
            elif value == 99:
                out.append(ValueError("a detail for the log only"))
            else:
                out.append({name: item.inputs["IN"] * 2 for name in item.outputs})
        return out

    def close(self) -> None:
        self.closed = True


def row(value: float, rows: int = 1) -> dict[str, np.ndarray[Any, Any]]:
    return {"IN": np.full((rows, 2), value, dtype=np.float32)}


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


@pytest.fixture
def stats() -> ModelStats:
    return ModelStats("m", "1")


@pytest.fixture
def inst() -> ListInstance:
    return ListInstance()


async def busy_then_queue(
    s: DynamicScheduler, inst: ListInstance, values: Sequence[float], outputs: Sequence[str] = ("OUT",)
) -> tuple[asyncio.Future[Arrays], list[asyncio.Future[Arrays]]]:
    """One request occupies the instance; ``values`` queue behind it and form the next batch."""
    first = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await until(inst.entered.is_set, "the first batch to start")
    rest = [asyncio.ensure_future(s.enqueue(WorkItem(row(v), outputs))) for v in values]
    await until(lambda: s.pending_count == len(values), "the requests to queue")
    return first, rest


def scheduler(inst: ListInstance, stats: ModelStats) -> DynamicScheduler:
    s = DynamicScheduler(SchedulerConfig(batching=True, dynamic=True, batch=BatchPolicy(8)), [inst], stats)
    s.start()
    return s


async def test_a_batch_arrives_as_the_list_of_its_requests(inst: ListInstance, stats: ModelStats) -> None:
    s = scheduler(inst, stats)
    first, rest = await busy_then_queue(s, inst, [1, 2, 3])
    inst.gate.set()
    outs = await asyncio.gather(first, *rest)
    assert [o["OUT"].tolist() for o in outs] == [[[0, 0]], [[2, 2]], [[4, 4]], [[6, 6]]]
    assert [len(b) for b in inst.batches] == [1, 3]
    assert [item.inputs["IN"].shape for item in inst.batches[1]] == [(1, 2)] * 3  # not concatenated
    assert stats.execution_count == 2
    assert stats.inference_count == 4
    assert sorted(stats.batches) == [1, 3]
    await s.close()
    assert inst.closed


async def test_each_request_keeps_its_rows_outputs_and_request(inst: ListInstance, stats: ModelStats) -> None:
    s = scheduler(inst, stats)
    first = asyncio.ensure_future(s.enqueue(WorkItem(row(0), ["OUT"])))
    await until(inst.entered.is_set, "the first batch to start")
    request = InferRequest([], id="r-1", parameters={"custom": 1})
    two_rows = asyncio.ensure_future(s.enqueue(WorkItem(row(1, rows=2), ["A"], request=request)))
    other = asyncio.ensure_future(s.enqueue(WorkItem(row(2), ["B", "A"])))
    await until(lambda: s.pending_count == 2, "two queued")
    inst.gate.set()
    await first
    assert (await two_rows)["A"].shape == (2, 2)
    assert sorted(await other) == ["A", "B"]
    batch = inst.batches[1]
    assert [item.outputs for item in batch] == [("A",), ("B", "A")]
    assert batch[0].request is request
    assert batch[1].request is None
    assert stats.batches[3].compute_infer.count == 1  # three rows in one execution
    await s.close()


async def test_an_error_for_one_request_fails_that_request_alone(inst: ListInstance, stats: ModelStats) -> None:
    s = scheduler(inst, stats)
    first, (good, bad, hidden, also_good) = await busy_then_queue(s, inst, [1, -5, 99, 3])
    inst.gate.set()
    await first
    assert (await good)["OUT"][0, 0] == 2
    assert (await also_good)["OUT"][0, 0] == 6
    with pytest.raises(InvalidArgument, match="negative input -5"):  # the instance's own error, as it is
        await bad
    with pytest.raises(InternalError) as info:  # anything else: a fixed message, the detail logged
        await hidden
    assert info.value.message == "model 'm:1' failed to execute the request"
    assert len(inst.batches[1]) == 4
    await s.close()


async def test_an_exception_from_execute_requests_fails_the_whole_batch(inst: ListInstance, stats: ModelStats) -> None:
    s = scheduler(inst, stats)
    first, rest = await busy_then_queue(s, inst, [1, 2])
    inst.raise_for_batch = RuntimeError("boom")
    inst.gate.set()
    for future in [first, *rest]:
        with pytest.raises(InternalError, match="failed to execute"):
            await future
    assert stats.execution_count == 0
    await s.close()


async def test_a_wrong_number_of_answers_fails_the_whole_batch(inst: ListInstance, stats: ModelStats) -> None:
    s = scheduler(inst, stats)
    inst.answers = lambda batch: [{"OUT": batch[0].inputs["IN"]}] * (len(batch) + 1)
    inst.gate.set()
    with pytest.raises(InternalError):
        await s.enqueue(WorkItem(row(1), ["OUT"]))
    await s.close()


async def test_unbatched_requests_arrive_one_per_list(inst: ListInstance, stats: ModelStats) -> None:
    s = DynamicScheduler(SchedulerConfig(batching=False, dynamic=False, batch=BatchPolicy(1)), [inst], stats)
    s.start()
    inst.gate.set()
    outs = await asyncio.gather(*(s.enqueue(WorkItem(row(v), ["OUT"])) for v in (1, 2, 3)))
    assert [o["OUT"][0, 0] for o in outs] == [2, 4, 6]
    assert [len(b) for b in inst.batches] == [1, 1, 1]
    await s.close()
