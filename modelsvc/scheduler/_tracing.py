"""What tracing sees of the scheduler: a traced request in the queue, and the batch it ran in.

The server's tracing implements these protocols; the scheduler only calls them (on the event loop) and never
lets a tracing error lose a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class TracedBatch(Protocol):
    """Tracing's view of one executing batch (see ``TracedRequest``)."""

    def finished(self, error: BaseException | None, timings: tuple[int, int, int] | None) -> None:
        """On the loop, when the batch is done: ``timings`` are input, infer and output ns (None on error)."""


class TracedRequest(Protocol):
    """What a traced request carries into the queue (``WorkItem.trace``); untraced ones carry None."""

    def batch_started(self, batch: Sequence[Any], rows: int, padded_length: int | None = None) -> TracedBatch:
        """On the loop, called on the first traced request of a batch that starts, with all its traced
        requests (``TracedRequest`` objects, in batch order) and the batch's rows. ``padded_length``: the length
        a padded batch (padding-aware batching, ``pad_inputs``) is padded to, passed only for padded batches
        (the span's ``modelsvc.padded_length``)."""
