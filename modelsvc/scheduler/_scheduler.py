"""The batch loop in front of a model version's instances, with Triton's dynamic batcher semantics.

``DynamicScheduler`` is the ``Scheduler`` (``_job``) of every model without ``sequence_batching``: its
``enqueue(job)`` queues the data plane's job (``WorkItem``) and answers with the job's outputs. Whenever
something changes (an arrival, a finished batch, an expired batch delay, a withdrawn request) the scheduler asks
its planner (``SchedulerConfig.batch``) what to send from the queue (``_queue``) and hands batches to free
instances in the same loop iteration. Each instance runs its batches on its own thread
(``_instances``; ONNX Runtime releases the GIL, so instances run in parallel), and the results come back to
the loop, in dispatch order when the model asks to preserve ordering.

Padding-aware batching (``SchedulerConfig.padding``): a plan's ``pad_to`` travels to the instance thread as
``_instances.Padding`` (the batch's padded length and its requests' own lengths). For each padded batch that
ran, the scheduler calls ``ModelStats.record_padding(rows x pad_to, sum of each request's rows x length)`` and,
when the batch is traced, ``batch_started(traced, rows, padded_length=pad_to)`` (unpadded batches call
``batch_started(traced, rows)`` as before).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from time import perf_counter_ns

from ..backends import BatchRequest, InputsMismatch, ModelInstance
from ..protocol import InternalError, ModelsvcError, Unavailable
from ._config import SchedulerConfig
from ._instances import Arrays, BatchResult, InstanceThread, Padding
from ._job import WorkItem
from ._planner import Plan
from ._queue import RequestQueue
from ._stats import ModelStats
from ._timer import DeadlineTimer
from ._tracing import TracedBatch, TracedRequest

logger = logging.getLogger("modelsvc.scheduler")
_FOREVER_NS = 10**18
_WAKE_LEAD_NS = 20_000
"""The batch timer's first lead: a batch goes once less than the lead remains of its queue delay, so that it
starts at the delay rather than a wake-up later (the loop woke 18-40 us late for a timerfd on 2 busy cores)."""
_MAX_LEAD_NS = 60_000
"""The most the lead grows to on a machine too busy to wake in time: a queue delay of 100 us still waits 40."""


class DynamicScheduler:
    """Queues requests for one model version and runs them on its instances (a ``Scheduler``).

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
        self._queue = RequestQueue(config, self._label, self._pump)
        self._free: deque[InstanceThread] = deque()
        self._threads: list[InstanceThread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = 0
        self._delay_timer: DeadlineTimer | None = None
        self._planned_ns = 0  # the clock reading of the last plan: a wait it asks for counts from there
        # The lead, learnt: each batch that the timer starts moves it by an eighth of how late (or early) that batch
        # started against its delay, so that on average batches start when their delay runs out.
        self._lead_ns = _WAKE_LEAD_NS
        self._aimed_ns = 0  # when the armed timer's batch should start (its deadline plus the lead)
        self._timer_pump = False  # True while the timer's callback plans
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
        return self._queue.count

    @property
    def _levels(self) -> list[deque[WorkItem]]:
        """The queue's priority levels, level 1 first (tests look at them)."""
        return self._queue.levels

    def start(self) -> None:
        """Start one thread per instance, on the running loop."""
        if self._loop is not None:
            return
        loop = self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        self._delay_timer = DeadlineTimer(loop, self._delay_over)
        self._queue.start(loop)
        for i, inst in enumerate(self._instances):
            worker = InstanceThread(inst, loop, f"modelsvc-{self.stats.name}-{i}")
            self._threads.append(worker)
            self._free.append(worker)

    async def enqueue(self, job: WorkItem) -> Arrays:
        """Queue a job and wait for its outputs (all the model's outputs in ``job.outputs``).

        ``job.trace`` is told when its batch starts and ends; instances that take requests one by one see
        ``job.request`` (its id and parameters).
        """
        if self._closing:
            raise Unavailable(f"model '{self._label}' is shutting down")
        self._queue.add(job)
        self._pump()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._queue.withdraw(job)
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
        self._pump()
        assert self._drained is not None
        if self._queue.count or self._in_flight:
            await self._drained.wait()
        if self._delay_timer is not None:
            self._delay_timer.close()
        for worker in self._threads:
            await asyncio.to_thread(worker.stop)
        for inst in self._instances:  # off the loop: a python model's finalize() may take its time
            await asyncio.to_thread(inst.close)

    # -- planning -------------------------------------------------------------------------------
    def _plan(self) -> Plan:
        if not self._queue.count:
            return Plan(0, None)
        if not self.config.dynamic:
            return Plan(1)
        # while draining nobody waits for more arrivals: plan as if every delay had run out
        self._planned_ns = perf_counter_ns()
        now = self._planned_ns + (_FOREVER_NS if self._closing else self._lead_ns)
        return self.config.batch.plan(self._queue.in_order(), now)

    # -- dispatching ----------------------------------------------------------------------------
    def _pump(self) -> None:
        """Hand batches to free instances while the planner says go; else arm the delay timer."""
        while self._free and self._queue.count:
            plan = self._plan()
            if not plan.take:
                if plan.wait_ns is not None:
                    self._arm_delay(plan.wait_ns)
                break
            items = self._queue.take(plan.positions())
            if items:
                self._launch(self._free.popleft(), items, plan.pad_to)
        if self._closing and not self._queue.count and not self._in_flight and self._drained is not None:
            self._drained.set()

    def _arm_delay(self, wait_ns: int) -> None:
        """Plan again ``wait_ns`` after the last plan's clock reading (a timer precise to microseconds)."""
        timer = self._delay_timer
        assert timer is not None
        due = self._planned_ns + wait_ns
        if timer.due_ns is None or due < timer.due_ns:
            self._aimed_ns = due + self._lead_ns
            timer.arm(due)

    def _delay_over(self) -> None:
        self._timer_pump = True
        try:
            self._pump()
        finally:
            self._timer_pump = False

    def _launch(self, worker: InstanceThread, items: list[WorkItem], pad_to: int | None = None) -> None:
        start_ns = perf_counter_ns()
        if self._timer_pump:  # a batch the delay timer started: learn how late it came
            self._timer_pump = False
            late = start_ns - self._aimed_ns
            self._lead_ns = min(_MAX_LEAD_NS, max(0, self._lead_ns + late // 8))
        seq = next(self._dispatch_seq)
        rows = sum(i.batch_size for i in items)
        spec = self.config.padding
        padding = None if pad_to is None or spec is None else Padding(spec, pad_to, tuple(i.length for i in items))
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
        batch_trace = None if traced is None else self._trace_started(traced, rows, padding)
        self._in_flight += 1

        def done(result: BatchResult | None, exc: BaseException | None) -> None:
            self._finished(result, exc, worker, items, rows, seq, start_ns, padding)
            if batch_trace is not None:
                self._trace_finished(batch_trace, result, exc)

        if worker.per_request is not None:
            worker.submit([BatchRequest(i.inputs, tuple(i.outputs), i.request) for i in items], None, done, padding)
        else:
            names = tuple(dict.fromkeys(itertools.chain.from_iterable(i.outputs for i in items)))
            worker.submit([i.inputs for i in items], names, done, padding)

    def _trace_started(self, traced: list[TracedRequest], rows: int, padding: Padding | None) -> TracedBatch | None:
        try:
            if padding is not None:
                return traced[0].batch_started(traced, rows, padded_length=padding.pad_to)
            return traced[0].batch_started(traced, rows)
        except Exception:  # tracing must not lose the batch
            logger.exception("tracing a batch of %s failed", self._label)
            return None

    def _trace_finished(self, batch: TracedBatch, result: BatchResult | None, exc: BaseException | None) -> None:
        try:
            batch.finished(exc, None if result is None else result.timings)
        except Exception:
            logger.exception("tracing a batch of %s failed", self._label)

    def _finished(
        self,
        result: BatchResult | None,
        exc: BaseException | None,
        worker: InstanceThread,
        items: list[WorkItem],
        rows: int,
        seq: int,
        start_ns: int,
        padding: Padding | None = None,
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
                        # inputs that do not fit each other: each request hears of its own shapes, not the batch's
                        own = error.for_inputs(item.inputs) if isinstance(error, InputsMismatch) else error
                        item.future.set_exception(own)
        else:
            assert result is not None
            parts = result.parts
            in_ns, infer_ns, out_ns = result.input_ns, result.infer_ns, result.output_ns
            self.stats.record_execution(rows, in_ns, infer_ns, out_ns)
            if padding is not None:
                useful = sum(i.batch_size * i.length for i in items)
                self.stats.record_padding(rows * padding.pad_to, useful)

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
