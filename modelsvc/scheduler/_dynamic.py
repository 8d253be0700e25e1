"""Triton's dynamic batcher as a planner (``dynamic_batching`` in config.pbtxt), a pure function of the queue.

The rules follow Triton's dynamic batcher:

* A batch grows from the head of the queue (highest priority first, then arrival order) while the
  next request has the same non-batch input shapes and the batch stays within ``limit``: the
  largest preferred batch size if any are given, else ``max_batch_size``.
* It goes at once when it reaches ``limit``, when the next request cannot join it (other shapes,
  or too many rows), or when the oldest request in it has waited ``max_queue_delay``.
* With preferred sizes, a batch that reaches a preferred size goes at once, cut back to the
  largest preferred size it reached (unless the delay has run out, then everything gathered goes).
* Otherwise the planner says how long to wait for more requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from ..backends import ModelConfig
from ._planner import IDLE, Plan, Queued


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The dynamic batcher's settings; a ``Planner``."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0

    @property
    def limit(self) -> int:
        return max(self.preferred_batch_sizes) if self.preferred_batch_sizes else self.max_batch_size

    def plan(self, queue: Iterable[Queued], now_ns: int) -> Plan:
        return plan_batch(queue, self, now_ns)

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> BatchPolicy | None:
        """The policy of a config with ``dynamic_batching``; None without one."""
        if not config.HasField("dynamic_batching"):
            return None
        db = config.dynamic_batching
        return cls(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=tuple(sorted(db.preferred_batch_size)),
            max_queue_delay_ns=db.max_queue_delay_microseconds * 1000,
        )


def plan_batch(queue: Iterable[Queued], policy: BatchPolicy, now_ns: int) -> Plan:
    """Decide what to send from ``queue`` (in dispatch order) at time ``now_ns``."""
    limit = policy.limit
    preferred = policy.preferred_batch_sizes
    size = 0
    count = 0
    best_preferred = 0
    closed = False
    first_key: Hashable = None
    oldest_ns = 0
    for item in queue:
        if count == 0:
            first_key = item.shape_key
            oldest_ns = item.enqueued_ns
            if item.batch_size >= limit:  # a request at or over the limit goes alone
                return Plan(1)
        elif item.shape_key != first_key or size + item.batch_size > limit:
            closed = True
            break
        size += item.batch_size
        count += 1
        if size == limit:
            return Plan(count)
        if size in preferred:
            best_preferred = count
    if count == 0:
        return IDLE
    waited = now_ns - oldest_ns
    delay_over = waited >= policy.max_queue_delay_ns
    if best_preferred and not delay_over:
        return Plan(best_preferred)
    if closed or delay_over:
        return Plan(count)
    return Plan(0, policy.max_queue_delay_ns - waited)
