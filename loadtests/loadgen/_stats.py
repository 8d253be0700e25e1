"""Pure arithmetic of a measurement: percentiles, windows, the stability rule, the server-side split.

Nothing here touches a socket or a clock, so every rule can be tested with made-up numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the percentiles reported for every point, as perf_analyzer prints them
PERCENTILES = (50, 90, 95, 99)
#: how many trailing windows the stability rule compares (perf_analyzer uses 3)
STABLE_WINDOWS = 3


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of values sorted ascending: the smallest value with at least ``pct`` % of the
    values at or below it. NaN for no values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


@dataclass
class Window:
    """What completed during one measurement window. Latencies are in seconds."""

    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    sent: int = 0  # requests started (open loop: the achieved arrival rate)
    late: int = 0  # open loop: sent more than LATE_S after their scheduled time
    dropped: int = 0  # open loop: not sent because every connection was busy

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_latency(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else math.nan


def is_stable(windows: Sequence[Window], pct: float) -> bool:
    """perf_analyzer's rule: the last three windows each have a throughput and an average latency within
    ±``pct`` % of the three windows' mean. A window without a success is never stable."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    if any(not w.latencies for w in last):
        return False
    for values in ([w.throughput for w in last], [w.mean_latency for w in last]):
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(v - mean) > mean * pct / 100.0 for v in values):
            return False
    return True


def merge(windows: Sequence[Window]) -> Window:
    """One window holding everything of ``windows`` (durations add up)."""
    out = Window(seconds=sum(w.seconds for w in windows))
    for w in windows:
        out.latencies.extend(w.latencies)
        out.errors.update(w.errors)
        out.sent += w.sent
        out.late += w.late
        out.dropped += w.dropped
    return out


# ---------------------------------------------------------------------------------------------------------
# server side: Triton's statistics JSON (GET /v2/models/{m}/stats, or the gRPC ModelStatistics answer)

_DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ServerCounters:
    """Cumulative counters of one model (all versions summed, or the one asked for)."""

    counts: Mapping[str, int]  # per duration kind: number of requests
    ns: Mapping[str, int]  # per duration kind: total nanoseconds
    inference_count: int
    execution_count: int

    @classmethod
    def from_stats_json(cls, body: Mapping[str, Any], version: str = "") -> ServerCounters:
        """Sum the ``model_stats`` entries of a statistics answer (only ``version`` when given)."""
        counts: Counter[str] = Counter()
        ns: Counter[str] = Counter()
        inferences = executions = 0
        for entry in body.get("model_stats", []):
            if version and str(entry.get("version", "")) != version:
                continue
            stats = entry.get("inference_stats", {})
            for kind in _DURATIONS:
                counts[kind] += int(stats.get(kind, {}).get("count", 0))
                ns[kind] += int(stats.get(kind, {}).get("ns", 0))
            inferences += int(entry.get("inference_count", 0))
            executions += int(entry.get("execution_count", 0))
        return cls(dict(counts), dict(ns), inferences, executions)


@dataclass(frozen=True)
class ServerSplit:
    """Server-side averages over an interval, as perf_analyzer's "Server:" lines show them."""

    requests: int  # successful requests the server counted
    inference_count: int
    execution_count: int
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    request_us: float  # the server's whole per-request time (its "success" duration)

    @property
    def compute_us(self) -> float:
        return self.compute_input_us + self.compute_infer_us + self.compute_output_us

    @property
    def avg_batch(self) -> float:
        """Inferences per execution: the average batch the model ran."""
        return self.inference_count / self.execution_count if self.execution_count else math.nan

    @classmethod
    def between(cls, before: ServerCounters, after: ServerCounters) -> ServerSplit:
        def avg_us(kind: str) -> float:
            n = after.counts.get(kind, 0) - before.counts.get(kind, 0)
            return (after.ns.get(kind, 0) - before.ns.get(kind, 0)) / n / 1000.0 if n else math.nan

        return cls(
            requests=after.counts.get("success", 0) - before.counts.get("success", 0),
            inference_count=after.inference_count - before.inference_count,
            execution_count=after.execution_count - before.execution_count,
            queue_us=avg_us("queue"),
            compute_input_us=avg_us("compute_input"),
            compute_infer_us=avg_us("compute_infer"),
            compute_output_us=avg_us("compute_output"),
            request_us=avg_us("success"),
        )
