"""What the rows of the benchmark suite (``bench_suite``) share: how long to measure, one row of the table, and
the two ways to load a server (closed-loop v2 JSON with httpx; a v2 binary-tensor point, perf_analyzer or Python).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests import bench_core
from loadtests.harness import _perf, _servers
from loadtests.harness._perf import Input, LoadResult


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure; ``quick`` is the smoke-run preset."""

    rounds: int = 3
    seconds: float = 10.0
    """Length of one Python-load window (the pair and MLServer rows; perf_analyzer has its own windows)."""
    pair_concurrency: tuple[int, ...] = (4, 8)
    pair_tokens: tuple[int, int] = (2000, 4000)
    served_concurrency: tuple[int, ...] = (16, 32)
    load: str = "perf"
    """"perf" (perf_analyzer where it runs) or "python" (asyncio + httpx, binary tensors)."""

    @classmethod
    def quick(cls, load: str) -> Settings:
        # documents of more than one 512-token window (still chunked and aggregated): on a loaded machine the naive
        # service answered no document of 2000-4000 tokens inside a 3 s window (a zero rate, no ratio)
        return cls(
            rounds=1, seconds=3.0, pair_concurrency=(4,), pair_tokens=(600, 1200), served_concurrency=(16,), load=load
        )


@dataclass
class Row:
    """One line of the table: the two sides, their ratio (modelsvc side / other side) and how it was measured."""

    benchmark: str
    modelsvc: str
    other: str
    ratio: float | None
    notes: str
    rounds: list[float] = field(default_factory=list)
    """The per-round ratios whose median is ``ratio``."""
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------
# measuring


@dataclass
class Stats:
    """One closed-loop window of JSON requests."""

    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def json_load(
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    seconds: float,
    *,
    until_last: bool = False,
    timeout: float = 120.0,
) -> Stats:
    """``concurrency`` clients POST ``bodies`` in turn to ``url`` for ``seconds`` (after a 1 s warm-up).

    Throughput counts the answers that arrive inside the window (a request may have been sent before it, so
    slow requests still count in a short window); latencies are theirs. An answer other than 200 is an error.
    ``until_last``: no warm-up, and every answer counts, over the time until the last one (a window that counted
    only the answers inside it gives 0/s where one request outlasts the window: long documents on a slow backend)."""

    async def run() -> Stats:
        latencies: list[float] = []
        errors = 0
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            start = time.perf_counter() + (0.0 if until_last else 1.0)
            end = start + seconds
            last = start

            async def worker(offset: int) -> None:
                nonlocal errors, last
                i = offset
                while (sent := time.perf_counter()) < end:
                    response = await client.post(url, content=bodies[i % len(bodies)], headers=headers)
                    done = last = time.perf_counter()
                    i += concurrency
                    if response.status_code != 200:
                        errors += 1
                    elif until_last or start <= done <= end:
                        latencies.append(done - sent)

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
        ms = np.asarray(latencies) * 1000.0 if latencies else np.asarray([math.nan])
        elapsed = last - start if until_last else seconds
        p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
        return Stats(len(latencies) / elapsed, p50, p99, errors)

    return asyncio.run(run())


def v2_point(
    server: _servers.ServerProcess,
    model: str,
    concurrency: int,
    inputs: Sequence[Input],
    outputs: Sequence[str],
    workdir: Path,
    settings: Settings,
    input_json: Path | None = None,
) -> LoadResult:
    """One v2 binary-tensor point: bench_core's perf_analyzer run, or its Python load when asked or needed."""
    use_perf = settings.load == "perf" and _perf.perf_analyzer_problem() is None
    if use_perf:
        return bench_core.measure(server, model, concurrency, inputs, outputs, workdir, True, input_json)
    return _perf.run_python_load(server.base_url, model, inputs, outputs, concurrency, settings.seconds)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)

