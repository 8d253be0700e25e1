"""Running batches on model instances: one thread per instance, results handed back to the event loop.

A batch reaches an instance concatenated along the batch dimension (``execute``), or, for an instance
with ``execute_requests`` (python models, as in Triton), as the list of its requests, each answered or
failed on its own. A padded batch (``Padding``, padding-aware batching) is padded on the instance's thread
before either: each request's padded inputs are extended to the batch's padded length, and each request's
padded outputs are cut back to its own length after, so that any backend serves it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import numpy as np

from ..backends import BatchRequest, ModelInstance, RequestsInstance
from ..protocol import InternalError
from ._padding import PadSpec

Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(slots=True)
class BatchResult:
    """What a batch gives back from its instance's thread."""

    parts: Sequence[Arrays | BaseException]
    """Each request's outputs in batch order (or, from ``execute_requests``, the exception failing it alone)."""
    input_ns: int
    """Gathering (and padding) the inputs."""
    infer_ns: int
    """Executing the model."""
    output_ns: int
    """Scattering (and cutting) the outputs."""

    @property
    def timings(self) -> tuple[int, int, int]:
        """The three durations, as tracing takes them."""
        return self.input_ns, self.infer_ns, self.output_ns


Done = Callable[[BatchResult | None, BaseException | None], None]


@dataclass(frozen=True, slots=True)
class Padding:
    """How a batch is padded: to ``pad_to``, its requests' own lengths in batch order."""

    spec: PadSpec
    pad_to: int
    lengths: tuple[int, ...]


#: (batch, output names, done, padding); output names None: a per-request batch of BatchRequest
_Submitted = tuple[Sequence[Any], Sequence[str] | None, Done, Padding | None]


def _execute_batch(
    instance: ModelInstance, batch: Sequence[Arrays], output_names: Sequence[str], padding: Padding | None = None
) -> BatchResult:
    """Runs on a worker thread: gather (and pad) inputs, execute, scatter (and cut) outputs. Returns the three
    durations."""
    t0 = perf_counter_ns()
    if padding is not None:
        batch = [padding.spec.pad(b, padding.pad_to) for b in batch]
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
    if padding is not None:
        parts = [padding.spec.cut(p, n, padding.pad_to) for p, n in zip(parts, padding.lengths, strict=True)]
    t3 = perf_counter_ns()
    return BatchResult(parts, t1 - t0, t2 - t1, t3 - t2)


def _execute_requests(
    instance: RequestsInstance, batch: Sequence[BatchRequest], padding: Padding | None = None
) -> BatchResult:
    """Runs on a worker thread: the instance answers each request of the batch on its own (each padded to the
    batch's length and its answer cut back, when the batch is padded)."""
    t0 = perf_counter_ns()
    if padding is not None:
        batch = [BatchRequest(padding.spec.pad(r.inputs, padding.pad_to), r.outputs, r.request) for r in batch]
    t1 = perf_counter_ns()
    parts: Sequence[Arrays | BaseException] = instance.execute_requests(batch)
    t2 = perf_counter_ns()
    if len(parts) != len(batch):
        raise InternalError(f"the instance answered {len(parts)} of {len(batch)} requests")
    if padding is None:
        return BatchResult(parts, 0, t2 - t1, 0)
    parts = [_cut(padding, part, n) for part, n in zip(parts, padding.lengths, strict=True)]
    return BatchResult(parts, t1 - t0, t2 - t1, perf_counter_ns() - t2)


def _cut(padding: Padding, part: Arrays | BaseException, length: int) -> Arrays | BaseException:
    """One request's answer cut back to its length; a wrongly shaped output fails that request alone."""
    if isinstance(part, BaseException):
        return part
    try:
        return padding.spec.cut(part, length, padding.pad_to)
    except InternalError as exc:
        return exc


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
        self.batches: queue.SimpleQueue[_Submitted | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(
        self, batch: Sequence[Any], outputs: Sequence[str] | None, done: Done, padding: Padding | None = None
    ) -> None:
        """Run the batch on this instance's thread; ``done(result, error)`` is called on the loop.

        ``outputs`` None: ``batch`` holds BatchRequest objects for ``execute_requests``. ``padding``: the batch is
        padded (its requests in ``batch`` order)."""
        self.batches.put((batch, outputs, done, padding))

    def stop(self) -> None:
        self.batches.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            submitted = self.batches.get()
            if submitted is None:
                return
            batch, outputs, done, padding = submitted
            try:
                if outputs is None:
                    assert self.per_request is not None
                    result = _execute_requests(self.per_request, batch, padding)
                else:
                    result = _execute_batch(self.instance, batch, outputs, padding)
            except BaseException as exc:
                self.loop.call_soon_threadsafe(done, None, exc)
            else:
                self.loop.call_soon_threadsafe(done, result, None)
