"""Running batches on model instances: one thread per instance, results handed back to the event loop.

A batch reaches an instance concatenated along the batch dimension (``execute``), or, for an instance
with ``execute_requests`` (python models, as in Triton), as the list of its requests, each answered or
failed on its own.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np

from ..backends import BatchRequest, ModelInstance, RequestsInstance
from ..protocol import InternalError

Arrays = dict[str, np.ndarray[Any, Any]]

#: each request's outputs (or, from ``execute_requests``, the exception failing it alone) and the three durations
Result = tuple[Sequence[Arrays | BaseException], int, int, int]
Done = Callable[[Result | None, BaseException | None], None]
#: (batch, output names, done); output names None: a per-request batch of BatchRequest
_Job = tuple[Sequence[Any], Sequence[str] | None, Done]


def _execute_batch(instance: ModelInstance, batch: Sequence[Arrays], output_names: Sequence[str]) -> Result:
    """Runs on a worker thread: gather inputs, execute, scatter outputs. Returns the three durations."""
    t0 = perf_counter_ns()
    merged = batch[0] if len(batch) == 1 else {name: np.concatenate([b[name] for b in batch]) for name in batch[0]}
    t1 = perf_counter_ns()
    outputs = instance.execute(merged, output_names)
    t2 = perf_counter_ns()
    if len(batch) == 1:
        parts = [outputs]
    else:
        first = next(iter(batch[0]))
        rows = [b[first].shape[0] for b in batch]
        total = sum(rows)
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != total:
                raise InternalError(
                    f"output '{name}' has shape {list(value.shape)}, expected a batch dimension of {total}"
                )
        parts = []
        start = 0
        for n in rows:
            parts.append({name: value[start : start + n] for name, value in outputs.items()})
            start += n
    t3 = perf_counter_ns()
    return parts, t1 - t0, t2 - t1, t3 - t2


def _execute_requests(instance: RequestsInstance, batch: Sequence[BatchRequest]) -> Result:
    """Runs on a worker thread: the instance answers each request of the batch on its own."""
    t0 = perf_counter_ns()
    parts = instance.execute_requests(batch)
    t1 = perf_counter_ns()
    if len(parts) != len(batch):
        raise InternalError(f"the instance answered {len(parts)} of {len(batch)} requests")
    return parts, 0, t1 - t0, 0


class InstanceThread:
    """One thread per instance: takes batches from a SimpleQueue, hands results back with one loop wake-up.

    Lighter than an executor (no work-item futures, no condition variables) and it keeps each instance
    on its own thread, which is what ONNX Runtime sessions expect.
    """

    def __init__(self, instance: ModelInstance, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.instance = instance
        self.loop = loop
        #: the instance when it takes a batch's requests one by one, else None
        self.per_request = instance if isinstance(instance, RequestsInstance) else None
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, batch: Sequence[Any], outputs: Sequence[str] | None, done: Done) -> None:
        """Run the batch on this instance's thread; ``done(result, error)`` is called on the loop.

        ``outputs`` None: ``batch`` holds BatchRequest objects for ``execute_requests``."""
        self.jobs.put((batch, outputs, done))

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            batch, outputs, done = job
            try:
                if outputs is None:
                    assert self.per_request is not None
                    result = _execute_requests(self.per_request, batch)
                else:
                    result = _execute_batch(self.instance, batch, outputs)
            except BaseException as exc:
                self.loop.call_soon_threadsafe(done, None, exc)
            else:
                self.loop.call_soon_threadsafe(done, result, None)
