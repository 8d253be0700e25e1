"""Padding-aware dynamic batching as a planner (``pad_inputs`` in the config's parameters; see ``_padding``).

Requests whose inputs agree in every dim but the padded axis share a batch, padded to the longest of them, or
to the next of ``pad_buckets``. The rule:

* The anchor, the first request in dispatch order (the oldest of the highest priority waiting), is in every
  batch. So no request starves: each batch takes the head of the queue, and a request reaches the head after
  at most the requests ahead of it (as with the dynamic batcher, requests of a higher priority go first).
* The batch is the anchor's group in the cheapest split of the queue. The requests of the anchor's shapes and
  priority level (a level's delayed requests rank with it), the anchor among them, are sorted by length and
  split into contiguous groups, each within ``limit`` rows (the largest preferred batch size if any are given,
  else ``max_batch_size``) and ``max_batch_tokens`` (rows x padded length), minimising what they cost in all:
  the number of calls x ``pad_call_cost_tokens`` (what one call costs, in padded tokens; ``_padding``) + the
  sum of rows x padded length. (A small dynamic programme, O(n x limit) for n such requests.) So on an
  accelerator, where a call costs as much as hundreds of padded tokens, batches are fuller and pad more; on a
  CPU, where a padded token costs as much as a real one, padding stays low. Requests of another shape or
  level are left for a later batch; a lower level never takes a place a higher one would have.
* The anchor goes alone when its own rows reach ``limit`` or its own rows x padded length reach the budget.
* When the batch reaches ``limit`` rows, or the split left a request of its shape and level out of it, it goes
  at once. With preferred sizes, a batch that reached one goes at once, cut back to the largest preferred size
  reached (the requests furthest in length from the anchor stay). Otherwise it waits for requests of similar
  length until the anchor has waited ``max_queue_delay``, then everything gathered goes.

The plan names the requests' positions (``Plan.of``) and the padded length (``Plan.pad_to``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backends import ModelConfig
from ._padding import PadSpec
from ._planner import IDLE, Plan, Queued


@dataclass(frozen=True, slots=True)
class PaddedPolicy:
    """The padding-aware batcher's settings; a ``Planner``."""

    max_batch_size: int
    spec: PadSpec
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0

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
        if rows >= limit or (budget and rows * pad(anchor.length) >= budget):
            return Plan.of((0,), pad(anchor.length))
        key = anchor.shape_key
        peers = [i for i in range(1, len(items)) if items[i].shape_key == key and items[i].level == anchor.level]
        group, split = self._group(items, peers)
        order = sorted(group, key=lambda i: (abs(items[i].length - anchor.length), i))
        picked = [0]
        longest = anchor.length
        best_preferred = 1 if rows in self.preferred_batch_sizes else 0
        full = split
        for i in order:
            rows += items[i].batch_size
            longest = max(longest, items[i].length)
            picked.append(i)
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

    def _group(self, items: list[Queued], peers: list[int]) -> tuple[list[int], bool]:
        """The anchor's peers (positions) in the anchor's group of the cheapest split of the anchor and its
        peers, sorted by length, into contiguous batches (each costing the spec's ``call_cost_tokens`` + rows x
        padded length, within ``limit`` rows and the token budget; of equally cheap splits, the one whose
        anchor's group has the most rows); and whether that split left any peer out."""
        ranked = sorted([0, *peers], key=lambda i: (items[i].length, i))
        n = len(ranked)
        where = ranked.index(0)
        head = self._cheapest(items, ranked)  # head[k]: the cheapest split of ranked[:k]
        tail = self._cheapest(items, ranked[::-1])  # tail[m]: of the last m
        pad = self.spec.padded_length
        budget = self.spec.max_batch_tokens
        best: tuple[int, int] | None = None
        span = (where, where + 1)
        for k in range(where, -1, -1):
            for j in range(where + 1, n + 1):
                rows = sum(items[i].batch_size for i in ranked[k:j])
                padded = pad(items[ranked[j - 1]].length)
                if j - k > 1 and (rows > self.limit or (budget and rows * padded > budget)):
                    break
                cost = head[k] + self.spec.call_cost_tokens + rows * padded + tail[n - j]
                if best is None or (cost, -rows) < best:
                    best, span = (cost, -rows), (k, j)
        group = [i for i in ranked[span[0] : span[1]] if i != 0]
        return group, len(group) < len(peers)

    def _cheapest(self, items: list[Queued], ranked: list[int]) -> list[int]:
        """cost[m]: what the cheapest split of ``ranked[:m]`` into contiguous batches costs (``ranked`` sorted by
        length, either way: a batch is padded to the longest of it)."""
        pad = self.spec.padded_length
        budget = self.spec.max_batch_tokens
        cost = [0] * (len(ranked) + 1)
        for j in range(1, len(ranked) + 1):
            rows = 0
            longest = 0
            best = -1
            for k in range(j, 0, -1):
                rows += items[ranked[k - 1]].batch_size
                longest = max(longest, items[ranked[k - 1]].length)
                padded = pad(longest)
                if k < j and (rows > self.limit or (budget and rows * padded > budget)):
                    break
                here = cost[k - 1] + self.spec.call_cost_tokens + rows * padded
                if best < 0 or here < best:
                    best = here
            cost[j] = best
        return cost
