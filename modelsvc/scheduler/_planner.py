"""The contract between the queue and a way of forming batches (a planner): pure, no clock, no event loop.

The scheduler hands a planner the queued requests in dispatch order (priority level 1 first, each level's
delayed requests after it, arrival order within each) and the time; the planner answers with a ``Plan``. It
never changes the queue itself: the scheduler takes the requests the plan names (the first ``Plan.take``, or
the positions ``Plan.pick`` of the snapshot it was given) and runs them as one batch, padded to
``Plan.pad_to`` when the plan names a padded length. Planners are chosen from the model's config by
``SchedulerConfig.from_model_config`` (see ``_config.PLANNERS``).
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

    @property
    def level(self) -> int:
        """The request's priority level (1 is the highest)."""
        ...

    @property
    def length(self) -> int:
        """Its length along the padded axis (``pad_inputs``); 0 for a model without padding."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """``take`` > 0: send ``take`` requests now: the first ``take`` of the snapshot, or, when ``pick`` is given,
    the requests at those positions of the snapshot (ascending, ``len(pick) == take``; use ``Plan.of``).
    ``pad_to``: the batch's padded length (None: the batch is not padded). ``take`` 0: wait ``wait_ns`` (None:
    until a new arrival)."""

    take: int
    wait_ns: int | None = None
    pick: tuple[int, ...] = ()
    pad_to: int | None = None

    @classmethod
    def of(cls, positions: Iterable[int], pad_to: int | None = None) -> Plan:
        """Send the requests at ``positions`` of the snapshot (any order) as one batch padded to ``pad_to``."""
        pick = tuple(sorted(positions))
        return cls(len(pick), None, pick, pad_to)

    def positions(self) -> tuple[int, ...]:
        """The positions of the snapshot this plan sends (ascending)."""
        return self.pick if self.pick else tuple(range(self.take))


IDLE = Plan(0, None)


class Planner(Protocol):
    """One way of forming batches, holding its settings from the model config."""

    def plan(self, queue: Iterable[Queued], now_ns: int) -> Plan:
        """What to send from ``queue`` (in dispatch order; read only as far as needed) at
        ``now_ns``. The requests sent must fit in one batch of the model (``max_batch_size`` rows);
        when the queue holds requests and ``now_ns`` lies past every delay, ``take`` must be > 0."""
        ...
