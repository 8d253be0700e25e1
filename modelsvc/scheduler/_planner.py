"""The contract between the queue and a way of forming batches (a planner): pure, no clock, no event loop.

The scheduler hands a planner the queued requests in dispatch order (priority level 1 first, each level's
delayed requests after it, arrival order within each) and the time; the planner answers with a ``Plan``. It
never changes the queue itself: the scheduler takes the first ``Plan.take`` requests and runs them as one
batch. Planners are chosen from the model's config by ``SchedulerConfig.from_model_config`` (see
``_config.PLANNERS``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol


class Queued(Protocol):
    """What a planner sees of one queued request."""

    @property
    def batch_size(self) -> int: ...

    @property
    def shape_key(self) -> Hashable: ...

    @property
    def enqueued_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """``take`` > 0: send the first ``take`` requests now. Else wait ``wait_ns`` (None: until a new arrival)."""

    take: int
    wait_ns: int | None = None


IDLE = Plan(0, None)


class Planner(Protocol):
    """One way of forming batches, holding its settings from the model config."""

    def plan(self, queue: Iterable[Queued], now_ns: int) -> Plan:
        """What to send from ``queue`` (in dispatch order; read only as far as needed) at
        ``now_ns``. The first ``take`` requests must fit in one batch of the model (``max_batch_size`` rows);
        when the queue holds requests and ``now_ns`` lies past every delay, ``take`` must be > 0."""
        ...
