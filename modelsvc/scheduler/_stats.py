"""Per model-version statistics, in the shape of Triton's statistics extension.

Padding-aware batching (``pad_inputs``) adds, outside Triton's shape (``as_json`` leaves them out), per padded
batch: ``ModelStats.record_padding(computed, useful)`` adds to the counters ``tokens_computed`` (rows x padded
length) and ``tokens_useful`` (each request's rows x its own length) and observes the batch's fill (useful /
computed) in ``batch_fill``, a ``FillHistogram`` with upper bounds ``BATCH_FILL_BUCKETS`` (0.1 .. 1.0):
``counts[i]`` batches had a fill <= ``bounds[i]`` and above the bound before it, ``sum`` is their fills' sum.

Updated only from the event loop thread, so plain integers suffice; the metrics endpoint and
``GET .../stats`` read them when asked, which keeps the hot path free of locks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


#: the upper bounds of the batch fill histogram (useful / computed tokens of a padded batch)
BATCH_FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(slots=True)
class FillHistogram:
    """Padded batches by their fill: ``counts[i]`` lie in (``bounds[i - 1]``, ``bounds[i]``] (not cumulative)."""

    bounds: tuple[float, ...] = BATCH_FILL_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(BATCH_FILL_BUCKETS))
    count: int = 0
    sum: float = 0.0

    def observe(self, fill: float) -> None:
        self.count += 1
        self.sum += fill
        for i, bound in enumerate(self.bounds):
            if fill <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1  # never above 1.0: a batch computes at least its useful tokens


@dataclass(slots=True)
class ModelStats:
    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)
    cache_hit: Duration = field(default_factory=Duration)
    """Requests answered from the response cache, and the time spent finding and copying their answers."""
    cache_miss: Duration = field(default_factory=Duration)
    """Requests looked up in vain, and the time spent looking and then storing the computed answer."""
    tokens_computed: int = 0
    """Padded batches: rows x padded length, summed (``record_padding``)."""
    tokens_useful: int = 0
    """Padded batches: each request's rows x its own length, summed."""
    batch_fill: FillHistogram = field(default_factory=FillHistogram)
    """Padded batches by their fill, useful / computed tokens."""

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, *, inferences: int | None = None
    ) -> None:
        """One batch ran: ``batch_size`` rows in one execution, ``inferences`` of them requests (default: all;
        fewer in a sequence batch with empty slots)."""
        self.execution_count += 1
        self.inference_count += batch_size if inferences is None else inferences
        self.last_inference_ms = time.time_ns() // 1_000_000
        stat = self.batches.get(batch_size)
        if stat is None:
            stat = self.batches[batch_size] = BatchStat()
        stat.compute_input.add(input_ns)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)

    def record_padding(self, computed: int, useful: int) -> None:
        """One padded batch ran: ``computed`` tokens (rows x padded length), ``useful`` of them the requests' own."""
        self.tokens_computed += computed
        self.tokens_useful += useful
        self.batch_fill.observe(useful / computed if computed else 1.0)

    def record_requests(self, count: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """``count`` requests of one batch: their summed waits, and each the batch's compute times
        (as Triton counts them)."""
        self.queue.add(queue_ns, count)
        self.compute_input.add(input_ns * count, count)
        self.compute_infer.add(infer_ns * count, count)
        self.compute_output.add(output_ns * count, count)

    def record_cached_success(self, request_ns: int) -> None:
        """A request answered from the response cache (``cache_hit`` counts it too): a success that waited in
        no queue and ran nothing."""
        self.success.add(request_ns)
        self.queue.add(0)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def count_inference(self, batch_size: int) -> None:
        """A request that ran through something other than this version's own batches (an ensemble's steps)."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.last_inference_ms = time.time_ns() // 1_000_000

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": self.cache_hit.as_json(),
                "cache_miss": self.cache_miss.as_json(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": s.compute_input.as_json(),
                    "compute_infer": s.compute_infer.as_json(),
                    "compute_output": s.compute_output.as_json(),
                }
                for size, s in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
