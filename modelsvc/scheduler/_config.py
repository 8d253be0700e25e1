"""A scheduler's settings from the model config: priority levels, their queue policies, and the planner.

``PLANNERS`` lists the ways to form batches; the first whose ``from_model_config`` accepts the config forms
the model's batches. A config none accepts gets one request per batch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backends import ModelConfig
from ._dynamic import BatchPolicy
from ._padded import PaddedPolicy
from ._padding import PadSpec
from ._planner import Planner


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


#: The ways to form batches, most specific first: each returns its planner for a config it applies to, else None.
PLANNERS: dict[str, Callable[[ModelConfig], Planner | None]] = {
    "pad_inputs": PaddedPolicy.from_model_config,
    "dynamic_batching": BatchPolicy.from_model_config,
}


def planner_for(config: ModelConfig) -> Planner | None:
    """The planner of the first of ``PLANNERS`` that applies to ``config``; None: one request per batch."""
    for from_model_config in PLANNERS.values():
        planner = from_model_config(config)
        if planner is not None:
            return planner
    return None


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    batching: bool
    """The model takes a batch dimension (max_batch_size > 0)."""
    dynamic: bool
    """Requests are batched together by ``batch`` (a planner applies, e.g. dynamic_batching is present)."""
    batch: Planner
    """Forms the batches when ``dynamic`` (a ``BatchPolicy`` for dynamic_batching)."""
    preserve_ordering: bool = False
    priority_levels: int = 1
    default_priority: int = 1
    policies: tuple[QueuePolicy, ...] = (QueuePolicy(),)
    """One per priority level, index 0 = level 1."""
    padding: PadSpec | None = None
    """Padding-aware batching (``pad_inputs``): each request's length is read at arrival, batches are padded."""

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> SchedulerConfig:
        batching = config.max_batch_size > 0
        planner = planner_for(config)
        batch = planner if planner is not None else BatchPolicy(max(config.max_batch_size, 1))
        if not config.HasField("dynamic_batching"):
            policy = QueuePolicy(allow_timeout_override=True)
            return cls(batching, planner is not None, batch, policies=(policy,))
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
            dynamic=planner is not None,
            batch=batch,
            preserve_ordering=db.preserve_ordering,
            priority_levels=levels,
            default_priority=default_level,
            policies=tuple(policies),
            padding=planner.spec if isinstance(planner, PaddedPolicy) else None,
        )


def _queue_policy(pb: Any) -> QueuePolicy:
    action = TimeoutAction.DELAY if pb.timeout_action == 1 else TimeoutAction.REJECT
    return QueuePolicy(
        timeout_action=action,
        default_timeout_ns=pb.default_timeout_microseconds * 1000,
        allow_timeout_override=pb.allow_timeout_override,
        max_queue_size=pb.max_queue_size,
    )
