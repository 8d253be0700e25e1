"""Scheduler benchmark: do instances run in parallel, and how exact are queue timeouts?

    python -m loadtests.bench_scheduler

(i)  The same ONNX model (one intra-op thread per instance) with instance_group count 1 and 2, no batching,
     at concurrency 4: if two instances really run at once (ONNX Runtime releases the GIL), throughput
     nearly doubles on a 2-core machine.
(ii) Requests queued behind a 60 s batch delay with a queue timeout T: how late past T is each rejected?
     Measured idle and while the same event loop serves a batched model at concurrency 16.
Runs in-process on the real repository, backend and scheduler (no HTTP), so it isolates the scheduler.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from modelsvc.backends import get_backend
from modelsvc.protocol import Unavailable
from modelsvc.repository import ModelRepository
from modelsvc.scheduler import DynamicScheduler, ModelStats, SchedulerConfig, WorkItem
from modelsvc.tools.onnx_models import token_classifier, write_model

SEQ = 128


def _config(name: str, count: int, extra: str = "") -> str:
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
        {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value {{ string_value: "1" }} }}
{extra}
"""


def _scheduler(repo: ModelRepository, name: str) -> DynamicScheduler:
    source = repo.load(name)
    instances = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    s = DynamicScheduler(SchedulerConfig.from_model_config(source.config), instances, ModelStats(name, "1"))
    s.start()
    return s


def _inputs(rows: int = 1) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(0, 1000, (rows, SEQ), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


async def _throughput(s: DynamicScheduler, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        x = _inputs()
        while time.perf_counter() < stop:
            await s.enqueue(WorkItem(x, ["logits"]))
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0)


async def parallel_instances(repo: ModelRepository) -> list[tuple[str, float]]:
    rows = []
    for name in ("one_instance", "two_instances"):
        s = _scheduler(repo, name)
        await _throughput(s, 4, 0.5)  # warm-up
        rows.append((name, await _throughput(s, 4, 4.0)))
        await s.close()
    return rows


async def timeout_lateness(repo: ModelRepository, loaded: bool) -> list[float]:
    held = _scheduler(repo, "held")
    busy = _scheduler(repo, "busy") if loaded else None
    stop = asyncio.Event()

    async def load() -> None:
        assert busy is not None
        x = _inputs()
        while not stop.is_set():
            await busy.enqueue(WorkItem(x, ["logits"]))

    loaders = [asyncio.ensure_future(load()) for _ in range(16)] if loaded else []
    await asyncio.sleep(0.2)
    late_ms: list[float] = []

    async def one(timeout_us: int) -> None:
        t0 = time.perf_counter()
        try:
            await held.enqueue(WorkItem(_inputs(), ["logits"], timeout_us=timeout_us))
        except Unavailable:
            late_ms.append((time.perf_counter() - t0) * 1e3 - timeout_us / 1e3)

    for _ in range(10):
        await asyncio.gather(*(one(t) for t in (5_000, 20_000, 50_000, 100_000) for _ in range(5)))
    stop.set()
    await asyncio.gather(*loaders)
    await held.close()
    if busy is not None:
        await busy.close()
    return late_ms


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = token_classifier(vocab=1000, hidden=256, layers=8)
        write_model(root, "one_instance", model, _config("one_instance", 1))
        write_model(root, "two_instances", model, _config("two_instances", 2))
        held = """dynamic_batching {
  max_queue_delay_microseconds: 60000000
  default_queue_policy { allow_timeout_override: true }
}"""
        write_model(root, "held", model, _config("held", 1, held))
        write_model(root, "busy", model, _config("busy", 1, "dynamic_batching { }"))
        repo = ModelRepository(root)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}")
        print(f"command: {' '.join([Path(sys.executable).name, '-m', 'loadtests.bench_scheduler'])}\n")

        rows = await parallel_instances(repo)
        base = rows[0][1]
        print("(i) instance_group count, no batching, concurrency 4, 1x128 tokens, 1 intra-op thread per instance")
        print(f"| {'model':<14} | {'infer/s':>8} | {'vs 1 instance':>13} |")
        print(f"|{'-' * 16}|{'-' * 10}|{'-' * 15}|")
        for name, rate in rows:
            print(f"| {name:<14} | {rate:8.1f} | {rate / base:12.2f}x |")

        print("\n(ii) queue timeout lateness: rejection time minus the timeout (ms), 200 requests, T = 5..100 ms")
        print(f"| {'event loop':<30} | {'p50':>6} | {'p99':>6} | {'max':>6} |")
        print(f"|{'-' * 32}|{'-' * 8}|{'-' * 8}|{'-' * 8}|")
        for loaded in (False, True):
            late = sorted(await timeout_lateness(repo, loaded))
            label = "idle" if not loaded else "serving 16 concurrent requests"
            p99 = late[int(len(late) * 0.99) - 1]
            print(f"| {label:<30} | {statistics.median(late):6.2f} | {p99:6.2f} | {late[-1]:6.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
