"""The queue in front of a model version's instances, with Triton's dynamic batcher semantics.

Each request waits in the queue of its priority level. Whenever something changes (an arrival, a
finished batch, an expired batch delay, a withdrawn request) the scheduler asks ``plan_batch`` what to
send and hands batches to free instances in the same loop iteration. Each instance runs its batches on
its own thread (ONNX Runtime releases the GIL, so instances run in parallel). Timeouts are timers set per
request, so a request is rejected (or delayed) at its deadline, not when the scheduler next looks. A
request whose caller went away leaves the queue at once and never runs.

A batch reaches an instance concatenated along the batch dimension (``execute``), or, for an instance
with ``execute_requests`` (python models, as in Triton), as the list of its requests, each answered or
failed on its own.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Protocol

import numpy as np

from ..backends import BatchRequest, ModelConfig, ModelInstance, RequestsInstance
from ..protocol import InferRequest, InternalError, ModelsvcError, Unavailable
from ._planner import BatchPolicy, Plan, plan_batch
from ._stats import ModelStats

Arrays = dict[str, np.ndarray[Any, Any]]
logger = logging.getLogger("modelsvc.scheduler")


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def timeout_ns(self, requested_us: int | None) -> int:
        """The timeout that applies to a request (0 = none)."""
        if requested_us is None or requested_us <= 0 or not self.allow_timeout_override:
            return self.default_timeout_ns
        requested = requested_us * 1000
        if self.default_timeout_ns == 0:
            return requested
        return min(requested, self.default_timeout_ns)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    batching: bool
    """The model takes a batch dimension (max_batch_size > 0)."""
    dynamic: bool
    """Requests are batched together (dynamic_batching is present)."""
    batch: BatchPolicy
    preserve_ordering: bool = False
    priority_levels: int = 1
    default_priority: int = 1
    policies: tuple[QueuePolicy, ...] = (QueuePolicy(),)
    """One per priority level, index 0 = level 1."""

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> SchedulerConfig:
        batching = config.max_batch_size > 0
        if not config.HasField("dynamic_batching"):
            policy = QueuePolicy(allow_timeout_override=True)
            return cls(batching, False, BatchPolicy(max(config.max_batch_size, 1)), policies=(policy,))
        db = config.dynamic_batching
        levels = max(db.priority_levels, 1)
        default_level = db.default_priority_level if db.priority_levels else 1
        default_policy = _queue_policy(db.default_queue_policy) if db.HasField("default_queue_policy") else None
        policies = []
        for level in range(1, levels + 1):
            if level in db.priority_queue_policy:
                policies.append(_queue_policy(db.priority_queue_policy[level]))
            else:
                policies.append(default_policy or QueuePolicy())
        return cls(
            batching=batching,
            dynamic=True,
            batch=BatchPolicy(
                max_batch_size=config.max_batch_size,
                preferred_batch_sizes=tuple(sorted(db.preferred_batch_size)),
                max_queue_delay_ns=db.max_queue_delay_microseconds * 1000,
            ),
            preserve_ordering=db.preserve_ordering,
            priority_levels=levels,
            default_priority=default_level,
            policies=tuple(policies),
        )


def _queue_policy(pb: Any) -> QueuePolicy:
    action = TimeoutAction.DELAY if pb.timeout_action == 1 else TimeoutAction.REJECT
    return QueuePolicy(
        timeout_action=action,
        default_timeout_ns=pb.default_timeout_microseconds * 1000,
        allow_timeout_override=pb.allow_timeout_override,
        max_queue_size=pb.max_queue_size,
    )


class TracedBatch(Protocol):
    """Tracing's view of one executing batch (see ``TracedRequest``)."""

    def finished(self, error: BaseException | None, timings: tuple[int, int, int] | None) -> None:
        """On the loop, when the batch is done: ``timings`` are input, infer and output ns (None on error)."""


class TracedRequest(Protocol):
    """What a traced request carries into the queue (``Scheduler.infer(trace=...)``); untraced ones carry None."""

    def batch_started(self, batch: Sequence[Any], rows: int) -> TracedBatch:
        """On the loop, called on the first traced request of a batch that starts, with all its traced
        requests (``TracedRequest`` objects, in batch order) and the batch's rows."""


@dataclass(eq=False, slots=True)
class WorkItem:
    """One request waiting for (or in) a batch. Carries its own future."""

    inputs: Arrays
    outputs: tuple[str, ...]
    batch_size: int
    shape_key: Hashable
    enqueued_ns: int
    future: asyncio.Future[Arrays]
    level: int
    queue: deque[WorkItem] | None = None
    timer: asyncio.TimerHandle | None = None
    #: called on the event loop when the batch holding this request starts (tracing hooks)
    on_start: Callable[[int], None] | None = field(default=None)
    #: the request's trace when it is traced (None: not traced)
    trace: TracedRequest | None = None
    #: the data plane's request, handed to instances that take requests one by one
    request: InferRequest | None = None


#: each request's outputs (or, from ``execute_requests``, the exception failing it alone) and the three durations
_Result = tuple[Sequence[Arrays | BaseException], int, int, int]
_FOREVER_NS = 10**18


def _execute_batch(instance: ModelInstance, batch: Sequence[Arrays], output_names: Sequence[str]) -> _Result:
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


def _execute_requests(instance: RequestsInstance, batch: Sequence[BatchRequest]) -> _Result:
    """Runs on a worker thread: the instance answers each request of the batch on its own."""
    t0 = perf_counter_ns()
    parts = instance.execute_requests(batch)
    t1 = perf_counter_ns()
    if len(parts) != len(batch):
        raise InternalError(f"the instance answered {len(parts)} of {len(batch)} requests")
    return parts, 0, t1 - t0, 0


_Done = Callable[[_Result | None, BaseException | None], None]
#: (batch, output names, done); output names None: a per-request batch of BatchRequest
_Job = tuple[Sequence[Any], Sequence[str] | None, _Done]


class _InstanceThread:
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

    def submit(self, batch: Sequence[Any], outputs: Sequence[str] | None, done: _Done) -> None:
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


class Scheduler:
    """Queues requests for one model version and runs them on its instances.

    Event driven: an arrival, a finished batch, an expired batch delay or a withdrawn request calls
    ``_pump``, which hands batches to free instances at once, in the same loop iteration. No task sits
    between a request and its batch, so a batch starts as soon as an instance is free.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        instances: Sequence[ModelInstance],
        stats: ModelStats,
        *,
        model_label: str = "",
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self.config = config
        self.stats = stats
        self._label = model_label or f"{stats.name}:{stats.version}"
        self._instances = list(instances)
        self._levels: list[deque[WorkItem]] = [deque() for _ in range(config.priority_levels)]
        self._delayed: list[deque[WorkItem]] = [deque() for _ in range(config.priority_levels)]
        self._queued = 0
        self._free: deque[_InstanceThread] = deque()
        self._threads: list[_InstanceThread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = 0
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_due = 0.0
        self._closing = False
        self._closer: asyncio.Task[None] | None = None
        self._drained: asyncio.Event | None = None
        # preserve_ordering: results are released in dispatch order
        self._dispatch_seq = itertools.count()
        self._release_next = 0
        self._ready_results: dict[int, Callable[[], None]] = {}

    # -- public ---------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        """Requests in the queue, not yet in a running batch."""
        return self._queued

    def start(self) -> None:
        """Start one thread per instance, on the running loop."""
        if self._loop is not None:
            return
        loop = self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        for i, inst in enumerate(self._instances):
            worker = _InstanceThread(inst, loop, f"modelsvc-{self.stats.name}-{i}")
            self._threads.append(worker)
            self._free.append(worker)

    async def infer(
        self,
        inputs: Arrays,
        outputs: Sequence[str],
        *,
        priority: int = 0,
        timeout_us: int | None = None,
        on_start: Callable[[int], None] | None = None,
        trace: TracedRequest | None = None,
        request: InferRequest | None = None,
    ) -> Arrays:
        """Queue a request and wait for its outputs (all the model's outputs in ``outputs``).

        ``trace``: the request's trace, told when its batch starts and ends. ``request``: the data plane's
        request, which instances that take requests one by one see (its id and parameters).
        """
        item = self._enqueue(inputs, outputs, priority, timeout_us, on_start, trace, request)
        self._pump()
        try:
            return await item.future
        except asyncio.CancelledError:
            self._withdraw(item)
            raise

    async def close(self) -> None:
        """Stop taking requests, finish those queued and running, release the instances.

        Concurrent and repeated calls wait for the same shutdown.
        """
        self._closing = True  # refuse new requests from this moment on
        if self._loop is None:  # never started: nothing queued, no threads
            for inst in self._instances:
                inst.close()
            return
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self._close())
        await self._closer

    async def _close(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        self._pump()
        assert self._drained is not None
        if self._queued or self._in_flight:
            await self._drained.wait()
        for worker in self._threads:
            await asyncio.to_thread(worker.stop)
        for inst in self._instances:  # off the loop: a python model's finalize() may take its time
            await asyncio.to_thread(inst.close)

    # -- queueing -------------------------------------------------------------------------------
    def _enqueue(
        self,
        inputs: Arrays,
        outputs: Sequence[str],
        priority: int,
        timeout_us: int | None,
        on_start: Callable[[int], None] | None,
        trace: TracedRequest | None = None,
        request: InferRequest | None = None,
    ) -> WorkItem:
        if self._closing:
            raise Unavailable(f"model '{self._label}' is shutting down")
        loop = self._loop
        assert loop is not None, "Scheduler.start() was not called"
        cfg = self.config
        level = priority if 1 <= priority <= cfg.priority_levels else cfg.default_priority
        policy = cfg.policies[level - 1]
        queue = self._levels[level - 1]
        if policy.max_queue_size and len(queue) + len(self._delayed[level - 1]) >= policy.max_queue_size:
            raise Unavailable(f"Exceeds maximum queue size of {policy.max_queue_size} for model '{self._label}'")
        shape_key: Hashable = None
        if cfg.batching:
            if len(inputs) == 1:
                ((name, array),) = inputs.items()
                batch_size = array.shape[0]
                if cfg.dynamic:
                    shape_key = (name, array.shape[1:])
            else:
                batch_size = next(iter(inputs.values())).shape[0]
                if cfg.dynamic:
                    shape_key = tuple([(n, a.shape[1:]) for n, a in inputs.items()])
        else:
            batch_size = 1
        item = WorkItem(
            inputs=inputs,
            outputs=tuple(outputs),
            batch_size=batch_size,
            shape_key=shape_key,
            enqueued_ns=perf_counter_ns(),
            future=loop.create_future(),
            level=level,
            queue=queue,
            on_start=on_start,
            trace=trace,
            request=request,
        )
        timeout_ns = policy.default_timeout_ns if timeout_us is None else policy.timeout_ns(timeout_us)
        if timeout_ns:
            deadline_ns = item.enqueued_ns + timeout_ns
            item.timer = loop.call_later(timeout_ns / 1e9, self._expire, item, policy.timeout_action, deadline_ns)
        queue.append(item)
        self._queued += 1
        return item

    def _withdraw(self, item: WorkItem) -> None:
        """The caller went away: drop the request if it has not started."""
        if item.queue is not None:
            item.queue.remove(item)
            item.queue = None
            self._queued -= 1
            self._pump()  # the batch ahead may now be complete, or the queue empty
        if item.timer is not None:
            item.timer.cancel()

    def _expire(self, item: WorkItem, action: TimeoutAction, deadline_ns: int) -> None:
        if item.queue is None:  # already running
            return
        early_ns = deadline_ns - perf_counter_ns()
        if early_ns > 0:
            # uvloop's timers count whole milliseconds of libuv's clock and can fire a fraction of a
            # millisecond before perf_counter reaches the deadline: never time a request out early
            assert self._loop is not None
            item.timer = self._loop.call_later(early_ns / 1e9, self._expire, item, action, deadline_ns)
            return
        if action is TimeoutAction.DELAY:
            item.queue.remove(item)
            item.queue = self._delayed[item.level - 1]
            item.queue.append(item)
            item.timer = None
            self._pump()
            return
        self._withdraw(item)
        if not item.future.done():
            item.future.set_exception(Unavailable("Request timeout expired"))

    def _queues_in_order(self) -> Iterator[deque[WorkItem]]:
        """Level 1, its delayed requests, level 2, its delayed requests, ..."""
        for level, delayed in zip(self._levels, self._delayed, strict=True):
            yield level
            yield delayed

    def _in_order(self) -> Iterator[WorkItem]:
        return itertools.chain.from_iterable(self._queues_in_order())

    def _plan(self) -> Plan:
        if not self._queued:
            return Plan(0, None)
        if not self.config.dynamic:
            return Plan(1)
        # while draining nobody waits for more arrivals: plan as if every delay had run out
        now = perf_counter_ns() + (_FOREVER_NS if self._closing else 0)
        return plan_batch(self._in_order(), self.config.batch, now)

    def _take(self, count: int) -> list[WorkItem]:
        """Pop the first ``count`` requests; any whose caller already left (not yet withdrawn) is dropped."""
        taken: list[WorkItem] = []
        popped = 0
        for level_queue in self._queues_in_order():
            while level_queue and popped < count:
                item = level_queue.popleft()
                popped += 1
                item.queue = None
                if item.timer is not None:
                    item.timer.cancel()
                    item.timer = None
                if not item.future.done():
                    taken.append(item)
            if popped == count:
                break
        self._queued -= popped
        return taken

    # -- dispatching ----------------------------------------------------------------------------
    def _pump(self) -> None:
        """Hand batches to free instances while the planner says go; else arm the delay timer."""
        while self._free and self._queued:
            plan = self._plan()
            if not plan.take:
                if plan.wait_ns is not None:
                    self._arm_delay(plan.wait_ns)
                break
            items = self._take(plan.take)
            if items:
                self._launch(self._free.popleft(), items)
        if self._closing and not self._queued and not self._in_flight and self._drained is not None:
            self._drained.set()

    def _arm_delay(self, wait_ns: int) -> None:
        loop = self._loop
        assert loop is not None
        due = loop.time() + wait_ns / 1e9
        if self._delay_timer is not None:
            if self._delay_due <= due:
                return
            self._delay_timer.cancel()
        self._delay_due = due
        self._delay_timer = loop.call_at(due, self._delay_over)

    def _delay_over(self) -> None:
        self._delay_timer = None
        self._pump()

    def _launch(self, worker: _InstanceThread, items: list[WorkItem]) -> None:
        start_ns = perf_counter_ns()
        seq = next(self._dispatch_seq)
        rows = sum(i.batch_size for i in items)
        traced: list[TracedRequest] | None = None
        for item in items:
            if item.on_start is not None:
                try:
                    item.on_start(rows)
                except Exception:  # a hook must not lose the batch, nor the instance
                    logger.exception("on_start hook of a request to %s failed", self._label)
            if item.trace is not None:
                if traced is None:
                    traced = [item.trace]
                else:
                    traced.append(item.trace)
        batch_trace = None if traced is None else self._trace_started(traced, rows)
        self._in_flight += 1

        def done(result: _Result | None, exc: BaseException | None) -> None:
            self._finished(result, exc, worker, items, rows, seq, start_ns)
            if batch_trace is not None:
                self._trace_finished(batch_trace, result, exc)

        if worker.per_request is not None:
            worker.submit([BatchRequest(i.inputs, i.outputs, i.request) for i in items], None, done)
        else:
            names = tuple(dict.fromkeys(itertools.chain.from_iterable(i.outputs for i in items)))
            worker.submit([i.inputs for i in items], names, done)

    def _trace_started(self, traced: list[TracedRequest], rows: int) -> TracedBatch | None:
        try:
            return traced[0].batch_started(traced, rows)
        except Exception:  # tracing must not lose the batch
            logger.exception("tracing a batch of %s failed", self._label)
            return None

    def _trace_finished(self, batch: TracedBatch, result: _Result | None, exc: BaseException | None) -> None:
        try:
            batch.finished(exc, None if result is None else result[1:])
        except Exception:
            logger.exception("tracing a batch of %s failed", self._label)

    def _finished(
        self,
        result: _Result | None,
        exc: BaseException | None,
        worker: _InstanceThread,
        items: list[WorkItem],
        rows: int,
        seq: int,
        start_ns: int,
    ) -> None:
        """On the loop, once a batch is done: resolve its requests, then start the next batch."""
        self._in_flight -= 1
        self._free.append(worker)
        if exc is not None:
            if isinstance(exc, ModelsvcError) and not isinstance(exc, InternalError):
                error: ModelsvcError = exc
            else:
                logger.error("model %s failed to execute a batch of %d", self._label, rows, exc_info=exc)
                error = InternalError(f"model '{self._label}' failed to execute the request")

            def resolve() -> None:
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(error)
        else:
            assert result is not None
            parts, in_ns, infer_ns, out_ns = result
            self.stats.record_execution(rows, in_ns, infer_ns, out_ns)

            waited = start_ns * len(items) - sum(item.enqueued_ns for item in items)
            self.stats.record_requests(len(items), waited, in_ns, infer_ns, out_ns)

            def resolve() -> None:
                for item, outputs in zip(items, parts, strict=True):
                    if not item.future.done():
                        if isinstance(outputs, BaseException):  # one request of a per-request batch failed
                            item.future.set_exception(self._request_error(outputs))
                        else:
                            item.future.set_result(outputs)

        if self.config.preserve_ordering and len(self._instances) > 1:
            self._ready_results[seq] = resolve
            while self._release_next in self._ready_results:
                self._ready_results.pop(self._release_next)()
                self._release_next += 1
        else:
            resolve()
        self._pump()

    def _request_error(self, exc: BaseException) -> ModelsvcError:
        """The error one request of a per-request batch fails with: the instance's own (its message was
        made for the client), or, for anything else, a fixed message with the detail in the log."""
        if isinstance(exc, ModelsvcError):
            return exc
        logger.error("model %s failed to execute a request", self._label, exc_info=exc)
        return InternalError(f"model '{self._label}' failed to execute the request")
