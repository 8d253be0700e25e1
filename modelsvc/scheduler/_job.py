"""One job from the data plane to the instance, and what every scheduler is to the data plane.

The data plane turns a request into one :class:`WorkItem` (its checked inputs, the outputs it wants, its
priority and timeout, its trace and the request itself) and hands it to the model version's
:class:`Scheduler`, as Triton's core hands an ``InferenceRequest`` to ``Scheduler::Enqueue``. The job travels
whole: the dynamic batcher queues it and batches it (``DynamicScheduler``, padding-aware batching included), the
sequence batcher routes it to its sequence's slot (``SequenceScheduler``), the ensemble scheduler runs its
steps (``modelsvc.engine``'s ``EnsembleScheduler``). The scheduler fills in what it learns on the way (when the
job arrived, its rows, its priority level, its length along the padded axis) and resolves the job's future.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..protocol import InferRequest
from ._instances import Arrays
from ._stats import ModelStats
from ._tracing import TracedRequest


@dataclass(eq=False, slots=True)
class WorkItem:
    """One request on its way to an instance: what the data plane asks for, then where the scheduler holds it.

    Built once per request by the data plane (or a warmup run, or a test) with the fields up to ``on_start``;
    the scheduler that takes it fills in the rest. Carries its own future.
    """

    inputs: Arrays
    """The request's tensors, checked against the model (with their batch dimension when the model batches)."""
    outputs: Sequence[str]
    """The outputs it wants (every model output when the client named none)."""
    priority: int = 0
    """Its ``priority`` parameter (0: the model's default level)."""
    timeout_us: int | None = None
    """Its ``timeout`` parameter in microseconds (None: the queue policy's default)."""
    trace: TracedRequest | None = None
    """Its trace when it is traced (None: not traced), told when its batch starts and ends."""
    request: InferRequest | None = None
    """The data plane's request, handed to instances that take requests one by one (its id and parameters)."""
    on_start: Callable[[int], None] | None = None
    """Called on the event loop with the batch's rows when the batch holding this request starts."""
    # -- filled in by the scheduler that takes the job -------------------------------------------------------
    future: asyncio.Future[Arrays] = field(init=False, repr=False)
    """Its outputs (or its error), set on the event loop."""
    enqueued_ns: int = field(default=0, init=False)
    batch_size: int = field(default=1, init=False)
    """Its rows (1 for a model that does not batch)."""
    shape_key: Hashable = field(default=None, init=False)
    """Requests batch together only with equal keys."""
    level: int = field(default=0, init=False)
    """Its priority level in the queue (1 is the highest)."""
    length: int = field(default=0, init=False)
    """Its length along the padded axis (``pad_inputs``); 0 for a model without padding."""
    queue: deque[WorkItem] | None = field(default=None, init=False, repr=False)
    """The queue it waits in (None: not waiting, it runs or has left)."""
    timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    """Its timeout in the queue, while armed."""


class Scheduler(Protocol):
    """A model version's scheduler, as the data plane, the model lifecycle and warmup see it: one entry point.

    Implemented by the dynamic batcher (``DynamicScheduler``), the sequence batcher (``SequenceScheduler``) and
    the ensemble scheduler (``modelsvc.engine``'s ``EnsembleScheduler``). A stream (a decoupled model) enqueues
    the same way: its job's ``request`` carries the response channel, and the caller cancels the call to
    withdraw it.
    """

    @property
    def stats(self) -> ModelStats:
        """The version's statistics, which the scheduler records into."""
        ...

    @property
    def pending_count(self) -> int:
        """Requests waiting, not yet in a running batch."""
        ...

    def start(self) -> None:
        """Get ready for jobs, on the running event loop (before the first ``enqueue``)."""

    async def enqueue(self, job: WorkItem) -> Arrays:
        """Run ``job`` and return its outputs; raises its error. Cancelling the call withdraws a job that has not
        started."""
        ...

    async def close(self) -> None:
        """Refuse new jobs, finish those held, release the instances."""
