"""Padding-aware batching through the scheduler: the queue taking a planner's picks, and real models padded."""

from __future__ import annotations

import asyncio

import numpy as np

from modelsvc.scheduler import QueuePolicy, SchedulerConfig
from modelsvc.scheduler._dynamic import BatchPolicy
from modelsvc.scheduler._queue import RequestQueue


async def test_the_queue_takes_any_positions_of_the_dispatch_order() -> None:
    levels = 2
    config = SchedulerConfig(True, True, BatchPolicy(8), priority_levels=levels, policies=(QueuePolicy(),) * levels)
    queue = RequestQueue(config, "m", lambda: None)
    queue.start(asyncio.get_running_loop())
    items = [
        queue.add({"IN": np.full((1, 1), v, np.float32)}, ["OUT"], priority, None, None)
        for v, priority in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
    ]
    assert list(queue.in_order()) == items
    assert queue.take([1, 3, 5]) == [items[1], items[3], items[5]]
    assert list(queue.in_order()) == [items[0], items[2], items[4]]
    assert queue.count == 3
    assert queue.take([0, 1]) == [items[0], items[2]]
    items[4].future.cancel()  # its caller left: taken out of the queue but not batched
    assert queue.take([0]) == []
    assert queue.count == 0
    assert all(item.queue is None for item in items)
