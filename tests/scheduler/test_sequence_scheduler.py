"""The sequence batcher's rules, driven directly (no server): an instance that records each batch and can be held
closed makes the order of events deterministic."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from modelsvc.backends import ModelConfig
from modelsvc.protocol import InferRequest
from modelsvc.scheduler import ModelStats, SequenceScheduler, SequenceSettings, WorkItem

CONFIG = """name: "m"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}
"""


class Recorder:
    """Sums into the state like the ONNX test model; records every batch; waits while ``gate`` is clear."""

    def __init__(self) -> None:
        self.name = "recorder"
        self.device = "cpu"
        self.providers = ["test"]
        self.batches: list[dict[str, np.ndarray[Any, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, inputs: dict[str, np.ndarray[Any, Any]], output_names: Sequence[str]) -> dict[str, Any]:
        assert self.gate.wait(5)
        self.batches.append({k: v.copy() for k, v in inputs.items()})
        out = (inputs["SUM_IN"] * (1 - inputs["START"]) + inputs["INPUT"]) * inputs["READY"]
        return {name: out for name in output_names}

    def close(self) -> None:
        pass


def _scheduler(strategy: str = "", mbs: int = 4, idle_us: int = 1_000_000) -> tuple[SequenceScheduler, Recorder]:
    config = text_format.Parse(CONFIG.format(mbs=mbs, idle=idle_us, strategy=strategy), ModelConfig())
    settings = SequenceSettings.from_model_config(config)
    assert settings is not None
    recorder = Recorder()
    scheduler = SequenceScheduler(settings, [recorder], ModelStats("m", "1"))
    scheduler.start()
    return scheduler, recorder


def _step(scheduler: SequenceScheduler, sid: int, value: float, **flags: bool) -> asyncio.Task[Any]:
    params: dict[str, Any] = {"sequence_id": sid, **{f"sequence_{k}": v for k, v in flags.items()}}
    inputs = {"INPUT": np.array([[value]], dtype=np.float32)}
    request = InferRequest(inputs=[], parameters=params)
    return asyncio.ensure_future(scheduler.enqueue(WorkItem(inputs, ["OUTPUT"], request=request)))


async def _value(task: asyncio.Task[Any]) -> float:
    return float((await task)["OUTPUT"][0, 0])


def test_oldest_never_batches_two_requests_of_one_sequence() -> None:
    async def run() -> None:
        scheduler, recorder = _scheduler("oldest { max_candidate_sequences: 8 }")
        recorder.gate.clear()
        first = _step(scheduler, 1, 1, start=True)
        await asyncio.sleep(0.05)  # sequence 1's START runs (held at the gate)
        queued = [
            _step(scheduler, 1, 2),
            _step(scheduler, 2, 10, start=True),
            _step(scheduler, 1, 3),
            _step(scheduler, 3, 100, start=True),
            _step(scheduler, 2, 20),
        ]
        await asyncio.sleep(0.02)
        recorder.gate.set()
        assert await _value(first) == 1
        assert [await _value(t) for t in queued] == [3, 10, 6, 100, 30]
        ids = [b["CORRID"].reshape(-1).tolist() for b in recorder.batches]
        assert ids[1] == [1, 2, 3]  # the oldest of each candidate, in arrival order
        assert all(len(set(batch)) == len(batch) for batch in ids)
        await scheduler.close()

    asyncio.run(run())


def test_direct_fills_a_hole_below_live_slots_with_an_empty_row() -> None:
    async def run() -> None:
        scheduler, recorder = _scheduler()
        for sid in (1, 2, 3):  # slots 0, 1, 2
            await _step(scheduler, sid, sid, start=True)
        await _step(scheduler, 1, 1, end=True)  # slot 0 frees
        assert await _value(_step(scheduler, 3, 5)) == 8
        last = recorder.batches[-1]
        assert last["READY"].reshape(-1).tolist() == [0, 0, 1]  # rows 0 and 1 empty: only slot 2 had a request
        assert last["CORRID"].reshape(-1).tolist() == [0, 0, 3]
        stats = scheduler.stats.as_json()
        assert stats["inference_count"] == 5
        assert {b["batch_size"] for b in stats["batch_stats"]} >= {3}
        await scheduler.close()

    asyncio.run(run())


def test_backlog_and_idle_counted_from_the_last_end() -> None:
    async def run() -> None:
        scheduler, _ = _scheduler(mbs=1, idle_us=200_000)  # one slot
        await _step(scheduler, 1, 1, start=True)
        waiting = _step(scheduler, 2, 10, start=True)
        await asyncio.sleep(0.05)
        assert (scheduler.live_sequences, scheduler.backlog_sequences) == (1, 1)
        assert not waiting.done()
        before_end = time.perf_counter_ns()
        await _step(scheduler, 1, 1, end=True)  # sequence 2 takes the slot
        assert await _value(waiting) == 10
        (entry,) = scheduler._live.values()
        assert entry.corrid == 2
        assert entry.last_ns > before_end  # idle from its START's end, not from its arrival in the backlog
        await asyncio.sleep(0.4)  # idle longer than 200 ms: released
        assert scheduler.live_sequences == 0
        with pytest.raises(Exception, match="must specify the START flag"):
            await _step(scheduler, 2, 1)
        await scheduler.close()

    asyncio.run(run())


def test_a_withdrawn_end_still_frees_the_slot() -> None:
    async def run() -> None:
        scheduler, recorder = _scheduler(mbs=1)
        recorder.gate.clear()
        start = _step(scheduler, 1, 1, start=True)
        await asyncio.sleep(0.05)  # the START runs, held
        end = _step(scheduler, 1, 2, end=True)
        await asyncio.sleep(0)
        end.cancel()  # the client of the END went away
        await asyncio.sleep(0)
        recorder.gate.set()
        assert await _value(start) == 1
        await asyncio.sleep(0.01)
        assert scheduler.live_sequences == 0
        assert await _value(_step(scheduler, 7, 4, start=True, end=True)) == 4  # the slot serves again
        await scheduler.close()

    asyncio.run(run())
