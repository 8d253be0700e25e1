"""Padding-aware dynamic batching as a planner (``pad_inputs`` in the config's parameters; see ``_padding``).

Requests whose inputs agree in every dim but the padded axis share a batch, padded to the longest of them, or
to the next of ``pad_buckets``. The rule:

* The anchor, the first request in dispatch order (the oldest of the highest priority waiting), is in every
  batch. So no request starves: each batch takes the head of the queue, and a request reaches the head after
  at most the requests ahead of it (as with the dynamic batcher, requests of a higher priority go first).
* The batch is filled with requests of the anchor's shapes, a higher priority level first (a level's delayed
  requests rank with it), and within a level the nearest in length to the anchor first (ties: the older).
  A request joins when the batch stays within ``limit`` rows (the largest preferred batch size if any are
  given, else ``max_batch_size``), within ``max_batch_tokens`` (rows x padded length), and its padding does
  not lower the batch's fill (useful tokens / computed tokens) below ``min_fill`` (0.75 unless set; a request
  that raises the fill always may join, as with buckets). A request fits only when all three hold; one that
  does not fit is left for a later batch, never for one of a lower priority level in its place.
* The anchor goes alone when its own rows reach ``limit`` or its own rows x padded length reach the budget.
* When the batch reaches ``limit`` rows, or a request was left out for rows or tokens, it goes at once. With
  preferred sizes, a batch that reached one goes at once, cut back to the largest preferred size reached (the
  requests added last, the furthest in length, stay). Otherwise it waits for requests of similar length until
  the anchor has waited ``max_queue_delay``, then everything gathered goes.

The plan names the requests' positions (``Plan.of``) and the padded length (``Plan.pad_to``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backends import ModelConfig
from ._padding import PadSpec
from ._planner import IDLE, Plan, Queued

#: the lowest batch fill (useful / computed tokens) a request's padding may bring a batch to
MIN_FILL = 0.75


@dataclass(frozen=True, slots=True)
class PaddedPolicy:
    """The padding-aware batcher's settings; a ``Planner``."""

    max_batch_size: int
    spec: PadSpec
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    min_fill: float = MIN_FILL

    @property
    def limit(self) -> int:
        return max(self.preferred_batch_sizes) if self.preferred_batch_sizes else self.max_batch_size

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> PaddedPolicy | None:
        """The policy of a config with ``pad_inputs``; None without one; ModelLoadError for bad entries."""
        spec = PadSpec.from_model_config(config)
        if spec is None:
            return None
        db = config.dynamic_batching
        return cls(
            max_batch_size=config.max_batch_size,
            spec=spec,
            preferred_batch_sizes=tuple(sorted(db.preferred_batch_size)),
            max_queue_delay_ns=db.max_queue_delay_microseconds * 1000,
        )

    def plan(self, queue: Iterable[Queued], now_ns: int) -> Plan:
        """What to send from ``queue`` (in dispatch order) at ``now_ns``: see the module's rule."""
        items = list(queue)
        if not items:
            return IDLE
        pad = self.spec.padded_length
        budget = self.spec.max_batch_tokens
        limit = self.limit
        anchor = items[0]
        rows = anchor.batch_size
        longest = anchor.length
        if rows >= limit or (budget and rows * pad(longest) >= budget):
            return Plan.of((0,), pad(longest))
        useful = rows * longest
        picked = [0]
        best_preferred = 1 if rows in self.preferred_batch_sizes else 0
        full = False
        key = anchor.shape_key
        order = sorted(range(1, len(items)), key=lambda i: (items[i].level, abs(items[i].length - anchor.length), i))
        for i in order:
            item = items[i]
            if item.shape_key != key:
                continue
            new_rows = rows + item.batch_size
            if new_rows > limit:
                full = True
                continue
            new_longest = max(longest, item.length)
            computed = new_rows * pad(new_longest)
            if budget and computed > budget:
                full = True
                continue
            new_useful = useful + item.batch_size * item.length
            fill = _fill(new_useful, computed)
            if fill < self.min_fill and fill < _fill(useful, rows * pad(longest)):
                continue
            picked.append(i)
            rows, longest, useful = new_rows, new_longest, new_useful
            if rows in self.preferred_batch_sizes:
                best_preferred = len(picked)
            if rows == limit:
                return Plan.of(picked, pad(longest))
        waited = now_ns - anchor.enqueued_ns
        delay_over = waited >= self.max_queue_delay_ns
        if best_preferred and not delay_over:
            kept = picked[:best_preferred]
            return Plan.of(kept, pad(max(items[i].length for i in kept)))
        if full or delay_over:
            return Plan.of(picked, pad(longest))
        return Plan(0, self.max_queue_delay_ns - waited)


def _fill(useful: int, computed: int) -> float:
    return useful / computed if computed else 1.0
