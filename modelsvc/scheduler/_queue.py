"""The requests waiting for a batch: one queue per priority level, each with its delayed requests, and timeouts.

Each request waits in the queue of its priority level. Timeouts are timers set per request, so a request is
rejected (or delayed) at its deadline, not when the scheduler next looks. A request whose caller went away
leaves the queue at once and never runs. Whenever the head of the queue may have changed, the queue calls the
scheduler back (``changed``) so that it plans again. With padding-aware batching each request's length along
the padded axis is read when it arrives (``WorkItem.length``; a request the padding refuses is a 400 and never
queues), and its shape key leaves that axis out. ``take`` removes any positions of the dispatch order. The queue
holds the jobs themselves (``WorkItem``, built by the data plane) and fills in what it learns of each: its rows,
shape key, level, arrival time, future and timer.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from time import perf_counter_ns

from ..protocol import Unavailable
from ._config import SchedulerConfig, TimeoutAction
from ._job import WorkItem


class RequestQueue:
    """The queued requests of one model version, in dispatch order: level 1, its delayed requests, level 2, ..."""

    def __init__(self, config: SchedulerConfig, label: str, changed: Callable[[], None]) -> None:
        self.config = config
        self._label = label
        self._changed = changed
        self.levels: list[deque[WorkItem]] = [deque() for _ in range(config.priority_levels)]
        self.delayed: list[deque[WorkItem]] = [deque() for _ in range(config.priority_levels)]
        #: requests in the queue, not yet taken into a batch
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Futures and timers of the requests to come belong to ``loop``."""
        self._loop = loop

    def add(self, job: WorkItem) -> None:
        """Queue a job at its priority level, with its timeout armed (the caller plans after)."""
        loop = self._loop
        assert loop is not None, "DynamicScheduler.start() was not called"
        cfg = self.config
        priority = job.priority
        level = priority if 1 <= priority <= cfg.priority_levels else cfg.default_priority
        policy = cfg.policies[level - 1]
        queue = self.levels[level - 1]
        inputs = job.inputs
        if cfg.padding is not None:
            job.length = cfg.padding.length_of(inputs)  # a request the padding refuses is a 400, never queued
        if policy.max_queue_size and len(queue) + len(self.delayed[level - 1]) >= policy.max_queue_size:
            raise Unavailable(f"Exceeds maximum queue size of {policy.max_queue_size} for model '{self._label}'")
        if cfg.batching:
            shape_key: Hashable = None
            if cfg.padding is not None:
                batch_size = next(iter(inputs.values())).shape[0]
                shape_key = cfg.padding.shape_key(inputs)
            elif len(inputs) == 1:
                ((name, array),) = inputs.items()
                batch_size = array.shape[0]
                if cfg.dynamic:
                    shape_key = (name, array.shape[1:])
            else:
                batch_size = next(iter(inputs.values())).shape[0]
                if cfg.dynamic:
                    shape_key = tuple([(n, a.shape[1:]) for n, a in inputs.items()])
            job.batch_size = batch_size
            job.shape_key = shape_key
        job.enqueued_ns = enqueued_ns = perf_counter_ns()
        job.future = loop.create_future()
        job.level = level
        job.queue = queue
        timeout_us = job.timeout_us
        timeout_ns = policy.default_timeout_ns if timeout_us is None else policy.timeout_ns(timeout_us)
        if timeout_ns:
            deadline_ns = enqueued_ns + timeout_ns
            job.timer = loop.call_later(timeout_ns / 1e9, self._expire, job, policy.timeout_action, deadline_ns)
        queue.append(job)
        self.count += 1

    def withdraw(self, item: WorkItem) -> None:
        """The caller went away: drop the request if it has not started."""
        if item.queue is not None:
            item.queue.remove(item)
            item.queue = None
            self.count -= 1
            self._changed()  # the batch ahead may now be complete, or the queue empty
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
            item.queue = self.delayed[item.level - 1]
            item.queue.append(item)
            item.timer = None
            self._changed()
            return
        self.withdraw(item)
        if not item.future.done():
            item.future.set_exception(Unavailable("Request timeout expired"))

    def _queues_in_order(self) -> Iterator[deque[WorkItem]]:
        """Level 1, its delayed requests, level 2, its delayed requests, ..."""
        for level, delayed in zip(self.levels, self.delayed, strict=True):
            yield level
            yield delayed

    def in_order(self) -> Iterator[WorkItem]:
        """The queued requests in dispatch order: what a planner sees."""
        return itertools.chain.from_iterable(self._queues_in_order())

    def take(self, positions: Sequence[int]) -> list[WorkItem]:
        """Remove the requests at ``positions`` (ascending) of the dispatch order (``in_order``); any whose caller
        already left (not yet withdrawn) is dropped from the batch."""
        taken: list[WorkItem] = []
        wanted = iter(positions)
        next_pos = next(wanted, None)
        start = 0  # position of the current deque's first request
        for level_queue in self._queues_in_order():
            if next_pos is None:
                break
            size = len(level_queue)
            if next_pos >= start + size:
                start += size
                continue
            picked: list[WorkItem] = []
            if next_pos == start:  # a prefix of this deque: pop it
                while next_pos is not None and next_pos == start + len(picked) and next_pos < start + size:
                    picked.append(level_queue.popleft())
                    next_pos = next(wanted, None)
                start += len(picked)
                size -= len(picked)
            rest: list[WorkItem] = []
            while next_pos is not None and next_pos < start + size:
                rest.append(level_queue[next_pos - start])
                next_pos = next(wanted, None)
            for item in rest:
                level_queue.remove(item)
            picked += rest
            start += size
            for item in picked:
                item.queue = None
                if item.timer is not None:
                    item.timer.cancel()
                    item.timer = None
                if not item.future.done():
                    taken.append(item)
            self.count -= len(picked)
        return taken
