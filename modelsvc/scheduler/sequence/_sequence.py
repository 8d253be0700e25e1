"""Triton's sequence batcher: requests of stateful models, routed by correlation id to sequence slots.

Each instance has ``SequenceSettings.slots`` sequence slots. A request that starts a sequence
(``sequence_start``) takes a free slot (the lowest slot number first, spread over the instances, as Triton
does) and keeps it until its END request has run or it has been idle for ``max_sequence_idle_microseconds``
(no request waiting or running, and none arrived or finished for that long);
when every slot is held the sequence waits in the backlog (never refused) and takes the next slot that frees.
The requests of one sequence run one at a time, in arrival order.

- ``direct``: a batch holds at most one request per slot of the instance, at the row of its slot; a slot
  without a request below the highest ready slot is an empty row with READY false (zeros). With
  ``max_queue_delay_microseconds`` the batch waits, up to that delay from its oldest request, until
  ``minimum_slot_utilization`` of the slots have a request.
- ``oldest``: a batch is formed from the oldest waiting request of each candidate sequence (slots here are
  ``max_candidate_sequences``), up to ``max_batch_size``, never two of one sequence; it waits up to
  ``max_queue_delay_microseconds`` for a full batch, or goes at the largest ``preferred_batch_size``.

Python models (instances with ``execute_requests``) get an empty row as a request of its own (READY false), as
Triton hands them; its answer is dropped. Rows batch together only when their inputs agree in names and shapes.
Each row gets the control tensors (``control_input``) and, for implicit state (``state``), the sequence's state
input: the initial state at START, then the state output of the sequence's previous request. A state output
reaches the client only when the config also lists it in ``output``: then it is an output like the others
(Triton's way to debug a state).

Errors, with Triton's messages (INVALID_ARG, a 400): no correlation id; a request without START for a sequence
that is not live (never started, ended, or released after idling); a batch size other than 1.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from ...backends import BatchRequest, ModelInstance
from ...protocol import InternalError, InvalidArgument, ModelsvcError, Unavailable
from .._instances import Arrays, BatchResult, InstanceThread
from .._job import WorkItem
from .._stats import ModelStats
from .._tracing import TracedRequest
from ._sequence_config import SequenceSettings
from ._sequence_rows import (
    CorrId,
    corrid_value,
    empty_row,
    request_params,
    row_inputs,
    shape_key,
    take_state,
)
from ._sequence_slots import Lane as _Lane
from ._sequence_slots import SequenceEntry as _Sequence
from ._sequence_slots import Step as _Step

logger = logging.getLogger("modelsvc.scheduler")


def _live_key(corrid: CorrId) -> tuple[bool, CorrId]:
    """The key of a live sequence: string and integer correlation ids never meet (``"1"`` is not ``1``)."""
    return isinstance(corrid, str), corrid


class SequenceScheduler:
    """The sequence batcher of one model version (a ``Scheduler``)."""

    def __init__(
        self,
        settings: SequenceSettings,
        instances: Sequence[ModelInstance],
        stats: ModelStats,
        *,
        model_label: str = "",
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self.settings = settings
        self.stats = stats
        self._label = model_label or f"{stats.name}:{stats.version}"
        self._instances = list(instances)
        self._lanes: list[_Lane] = []
        self._free: list[tuple[int, int]] = []  # (slot, lane index): a heap, lowest slot first
        self._live: dict[tuple[bool, CorrId], _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._closer: asyncio.Task[None] | None = None
        self._drained: asyncio.Event | None = None
        self._oneshot = itertools.count(1)

    # -- public ---------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        """Requests waiting, not yet in a running batch (in slots and in the backlog)."""
        return sum(len(s.steps) for s in self._sequences())

    @property
    def live_sequences(self) -> int:
        """Sequences holding a slot."""
        return sum(1 for lane in self._lanes for s in lane.slots if s is not None)

    @property
    def backlog_sequences(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._backlog)

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        for i, inst in enumerate(self._instances):
            worker = InstanceThread(inst, loop, f"modelsvc-{self.stats.name}-{i}")
            self._lanes.append(_Lane(i, worker, [None] * self.settings.slots))
        self._free = [(slot, lane.index) for slot in range(self.settings.slots) for lane in self._lanes]
        heapq.heapify(self._free)

    async def enqueue(self, job: WorkItem) -> Arrays:
        """Queue a request of a sequence and wait for its outputs. ``job.request`` None (a warmup sample): a
        sequence of its own, started and ended by this request. ``job.priority`` and ``job.timeout_us`` are unused
        here: requests run in their sequence's order, and a request waits in the backlog until a slot frees
        (Triton's backlog timeouts are not implemented)."""
        step = self._enqueue(job)
        self._pump()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(step)
            raise

    async def close(self) -> None:
        """Refuse new requests, run those queued (sequences that wait for more are released), stop."""
        self._closing = True
        if self._loop is None:
            for inst in self._instances:
                inst.close()
            return
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self._close())
        await self._closer

    async def _close(self) -> None:
        self._pump()
        assert self._drained is not None
        if not self._is_drained():
            await self._drained.wait()
        for seq in list(self._live.values()):
            self._cancel_idle(seq)
        for lane in self._lanes:
            if lane.timer is not None:
                lane.timer.cancel()
            await asyncio.to_thread(lane.worker.stop)
        for inst in self._instances:
            await asyncio.to_thread(inst.close)

    # -- queueing -------------------------------------------------------------------------------
    def _enqueue(self, job: WorkItem) -> _Step:
        if self._closing:
            raise Unavailable(f"model '{self._label}' is shutting down")
        loop = self._loop
        assert loop is not None, "SequenceScheduler.start() was not called"
        name = self.stats.name
        inputs, request = job.inputs, job.request
        if request is None:
            corrid: CorrId = f"modelsvc-warmup-{next(self._oneshot)}"
            start = end = True
        else:
            corrid, start, end = request_params(request.parameters, name)
        if self.settings.max_batch_size > 0:
            rows = next(iter(inputs.values())).shape[0] if inputs else 1
            if rows != 1:
                raise InvalidArgument(
                    f"inference request to model '{name}' must specify batch-size 1 due to requirements of "
                    "sequence batcher"
                )
        value = corrid_value(self.settings, corrid, name) if request is not None else None
        key = _live_key(corrid)
        seq = self._live.get(key)
        if seq is None and not start:
            raise InvalidArgument(
                f"inference request for sequence {corrid} to model '{name}' must specify the START flag on the "
                "first request of the sequence"
            )
        now = perf_counter_ns()
        if seq is None:
            seq = _Sequence(corrid, value)
            self._live[key] = seq
            self._assign(seq)
        elif start:
            logger.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                corrid,
                name,
            )
        job.future = loop.create_future()
        job.enqueued_ns = now
        job.shape_key = shape_key(inputs)
        step = _Step(job, start, end)
        seq.steps.append(step)
        seq.last_ns = now
        if end:
            seq.live = False
            del self._live[key]
            self._cancel_idle(seq)
        elif seq.idle is None:
            self._arm_idle(seq, self.settings.idle_ns)
        return step

    def _assign(self, seq: _Sequence) -> None:
        """A slot for a new sequence, or the backlog."""
        if self._free:
            slot, index = heapq.heappop(self._free)
            lane = self._lanes[index]
            lane.slots[slot] = seq
            seq.lane, seq.slot = lane, slot
        else:
            self._backlog.append(seq)

    def _release(self, seq: _Sequence) -> None:
        """The sequence is over (END ran, or idle): its slot goes to the backlog's first sequence, or is free."""
        self._cancel_idle(seq)
        seq.state = None
        lane = seq.lane
        if lane is None:
            return
        lane.slots[seq.slot] = None
        slot = seq.slot
        seq.lane, seq.slot = None, -1
        if self._backlog:
            nxt = self._backlog.popleft()
            lane.slots[slot] = nxt
            nxt.lane, nxt.slot = lane, slot
        else:
            heapq.heappush(self._free, (slot, lane.index))

    def _withdraw(self, step: _Step) -> None:
        """The caller went away before its request ran: it leaves its sequence's queue."""
        for seq in self._sequences():
            if step in seq.steps:
                seq.steps.remove(step)
                self._release_if_over(seq)
                break
        self._pump()

    def _release_if_over(self, seq: _Sequence) -> None:
        """A sequence that takes no more requests (its END came) and has none left gives its slot (or its place in
        the backlog) up; also when its END request was withdrawn."""
        if seq.live or seq.steps or seq.running:
            return
        self._release(seq)
        if seq in self._backlog:
            self._backlog.remove(seq)

    def _sequences(self) -> list[_Sequence]:
        held = [s for lane in self._lanes for s in lane.slots if s is not None]
        return held + list(self._backlog)

    # -- idle sequences -------------------------------------------------------------------------
    def _arm_idle(self, seq: _Sequence, after_ns: int) -> None:
        assert self._loop is not None
        seq.idle = self._loop.call_later(max(after_ns, 0) / 1e9, self._idle_check, seq)

    def _cancel_idle(self, seq: _Sequence) -> None:
        if seq.idle is not None:
            seq.idle.cancel()
            seq.idle = None

    def _idle_check(self, seq: _Sequence) -> None:
        seq.idle = None
        if not seq.live:
            return
        left = seq.last_ns + self.settings.idle_ns - perf_counter_ns()
        if left > 0 or seq.steps or seq.running or seq.lane is None:
            self._arm_idle(seq, left if left > 0 else self.settings.idle_ns)
            return
        logger.info(
            "sequence %s of model '%s' was idle for more than %d us: released",
            seq.corrid,
            self.stats.name,
            self.settings.idle_ns // 1000,
        )
        self._retire(seq)
        self._pump()

    def _retire(self, seq: _Sequence) -> None:
        """A live sequence ends without its END (idle, or the server closing): it leaves ``_live`` and its slot."""
        seq.live = False
        key = _live_key(seq.corrid)
        if self._live.get(key) is seq:
            del self._live[key]
        self._release(seq)

    # -- batching -------------------------------------------------------------------------------
    def _pump(self) -> None:
        if self._closing:
            self._release_waiting()
        for lane in self._lanes:
            if not lane.busy:
                self._try_lane(lane)
        if self._closing and self._drained is not None and self._is_drained():
            self._drained.set()

    def _is_drained(self) -> bool:
        return not any(lane.busy for lane in self._lanes) and not any(s.steps for s in self._sequences())

    def _release_waiting(self) -> None:
        """While closing: sequences that wait for requests that will not come give their slots up."""
        for lane in self._lanes:
            for seq in lane.slots:
                if seq is not None and not seq.steps and not seq.running:
                    self._retire(seq)

    def _try_lane(self, lane: _Lane) -> None:
        ready = [(slot, s) for slot, s in enumerate(lane.slots) if s is not None and s.steps and not s.running]
        if not ready:
            return
        cfg = self.settings
        now = perf_counter_ns()
        if cfg.strategy == "oldest":
            ready.sort(key=lambda r: r[1].steps[0].job.enqueued_ns)
        key = ready[0][1].steps[0].job.shape_key
        chosen = [r for r in ready if r[1].steps[0].job.shape_key == key]
        limit = max(1, cfg.max_batch_size)
        if cfg.strategy == "oldest":
            chosen = chosen[:limit]
        wait_ns = 0 if self._closing else self._wait_ns(chosen, now)
        if wait_ns > 0:
            if lane.timer is None:
                assert self._loop is not None
                lane.timer = self._loop.call_later(wait_ns / 1e9, self._lane_timer, lane)
            return
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        if cfg.strategy == "direct":
            chosen.sort(key=lambda r: r[0])
        self._launch(lane, chosen)

    def _wait_ns(self, chosen: list[tuple[int, _Sequence]], now: int) -> int:
        """How much longer to wait for a fuller batch than ``chosen`` (0: go now)."""
        cfg = self.settings
        count = len(chosen)
        delay = cfg.max_queue_delay_ns
        if delay <= 0:
            return 0
        oldest = min(s.steps[0].job.enqueued_ns for _, s in chosen)
        left = oldest + delay - now
        if left <= 0:
            return 0
        if cfg.strategy == "direct":
            return 0 if count >= cfg.minimum_slot_utilization * cfg.slots else left
        if count >= max(1, cfg.max_batch_size):
            return 0
        if cfg.preferred_batch_sizes and count == cfg.preferred_batch_sizes[-1]:
            return 0
        return left

    def _lane_timer(self, lane: _Lane) -> None:
        lane.timer = None
        if not lane.busy:
            self._try_lane(lane)

    def _launch(self, lane: _Lane, chosen: list[tuple[int, _Sequence]]) -> None:
        cfg = self.settings
        start_ns = perf_counter_ns()
        taken: list[tuple[_Sequence, _Step]] = []
        rows: list[Arrays] = []
        for _, seq in chosen:
            step = seq.steps.popleft()
            seq.running = True
            if step.start:
                seq.state = None  # row_inputs feeds the initial state
            rows.append(row_inputs(cfg, step.job.inputs, seq.state, start=step.start, end=step.end, corrid=seq.value))
            taken.append((seq, step))
        per_request = lane.worker.per_request is not None
        order: list[int | None] = list(range(len(rows)))  # batch row -> index into taken (None: an empty row)
        if cfg.strategy == "direct" and cfg.max_batch_size > 0:
            slots = [slot for slot, _ in chosen]
            by_slot = dict(zip(slots, range(len(rows)), strict=True))
            order = [by_slot.get(slot) for slot in range(max(slots) + 1)]
            template = rows[0]
            rows = [rows[i] if i is not None else empty_row(cfg, template) for i in order]
        executed = len(rows)
        traced = self._started(taken, executed)
        lane.busy = True
        wanted = cfg.state_outputs

        def done(result: BatchResult | None, exc: BaseException | None) -> None:
            self._finished(lane, taken, order, executed, start_ns, result, exc)
            if traced is not None:
                try:
                    traced.finished(exc, None if result is None else result.timings)
                except Exception:
                    logger.exception("tracing a batch of %s failed", self._label)

        if per_request:
            jobs = [None if i is None else taken[i][1].job for i in order]
            first = tuple(dict.fromkeys(itertools.chain(taken[0][1].job.outputs, wanted)))
            batch = [  # an empty row is a request of its own (READY false), as Triton hands python models
                BatchRequest(row, first, None)
                if job is None
                else BatchRequest(row, tuple(dict.fromkeys(itertools.chain(job.outputs, wanted))), job.request)
                for row, job in zip(rows, jobs, strict=True)
            ]
            lane.worker.submit(batch, None, done)
        else:
            names = tuple(dict.fromkeys(itertools.chain(*(step.job.outputs for _, step in taken), wanted)))
            lane.worker.submit(rows, names, done)

    def _started(self, taken: list[tuple[_Sequence, _Step]], rows: int) -> Any:
        traced: list[TracedRequest] = []
        for _, step in taken:
            job = step.job
            if job.on_start is not None:
                try:
                    job.on_start(rows)
                except Exception:
                    logger.exception("on_start hook of a request to %s failed", self._label)
            if job.trace is not None:
                traced.append(job.trace)
        if not traced:
            return None
        try:
            return traced[0].batch_started(traced, rows)
        except Exception:
            logger.exception("tracing a batch of %s failed", self._label)
            return None

    def _finished(
        self,
        lane: _Lane,
        taken: list[tuple[_Sequence, _Step]],
        order: list[int | None],
        executed: int,
        start_ns: int,
        result: BatchResult | None,
        exc: BaseException | None,
    ) -> None:
        lane.busy = False
        answers: list[Arrays | BaseException]
        if exc is not None or result is None:
            answers = [self._error(exc)] * len(taken)
        else:
            parts = result.parts
            in_ns, infer_ns, out_ns = result.input_ns, result.infer_ns, result.output_ns
            answers = [InternalError("no answer")] * len(taken)
            for row, index in enumerate(order):
                if index is not None:
                    answers[index] = parts[row]
            self.stats.record_execution(executed, in_ns, infer_ns, out_ns, inferences=len(taken))
            waited = start_ns * len(taken) - sum(step.job.enqueued_ns for _, step in taken)
            self.stats.record_requests(len(taken), waited, in_ns, infer_ns, out_ns)
        done_ns = perf_counter_ns()
        for (seq, step), answer in zip(taken, answers, strict=True):
            seq.running = False
            seq.last_ns = done_ns  # idle from here: a request that waited in the backlog is not idleness
            if not isinstance(answer, BaseException):
                try:
                    seq.state = take_state(self.settings, answer, self.stats.name)
                    answer = {name: answer[name] for name in step.job.outputs if name in answer}
                except ModelsvcError as err:
                    logger.error("%s", err)
                    answer = err
            future = step.job.future
            if not future.done():
                if isinstance(answer, BaseException):
                    future.set_exception(self._error(answer))
                else:
                    future.set_result(answer)
            self._release_if_over(seq)
        self._pump()

    def _error(self, exc: BaseException | None) -> ModelsvcError:
        if isinstance(exc, ModelsvcError):
            return exc
        logger.error("model %s failed to execute a sequence batch", self._label, exc_info=exc)
        return InternalError(f"model '{self._label}' failed to execute the request")
