"""The measurement loop: closed-loop workers or Poisson arrivals, warm-up, windows until stable."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtests.loadgen._inputs import InputSpec, Payloads, Target, prepare
from loadtests.loadgen._stats import (
    PERCENTILES,
    STABLE_WINDOWS,
    ServerCounters,
    ServerSplit,
    Window,
    is_stable,
    merge,
    percentile,
)
from loadtests.loadgen._transports import CONNECTION_ERROR, StatsReader, Transport, open_transport

#: open loop: a request sent more than this after its scheduled time counts as late
LATE_S = 0.001
#: closed loop: pause after a connection error so that a dead server is not hammered in a hot loop
ERROR_PAUSE_S = 0.01
#: the error kind of a request whose sending raised in the generator itself
CLIENT_ERROR = "client error"


async def _send(transport: Transport, payload: Any) -> str | None:
    """``transport.request`` that never raises (but for cancellation): an exception becomes an error kind, so that
    every request sent ends as a success or a counted error."""
    try:
        return await transport.request(payload)
    except Exception as exc:
        return f"{CLIENT_ERROR}: {type(exc).__name__}"


@dataclass(frozen=True)
class Load:
    """How much load, and how long to measure it (defaults as perf_analyzer's)."""

    concurrency: int = 1
    """Closed loop: this many requests outstanding at all times."""
    request_rate: float | None = None
    """Open loop when set: requests per second, with Poisson (exponential inter-arrival) timing."""
    warmup_s: float = 1.0
    window_s: float = 5.0
    stability_pct: float = 10.0
    max_windows: int = 10
    windows: int | None = None
    """A fixed number of windows instead of stopping when stable."""
    timeout_s: float = 30.0
    max_inflight: int = 1024
    """Open loop: requests beyond this many outstanding are dropped (counted, not sent)."""
    seed: int = 0

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            return f"rate {self.request_rate:g}/s"
        return f"concurrency {self.concurrency}"


@dataclass
class Result:
    """One measured load level. Latencies in milliseconds; throughput in requests (and inferences) per second."""

    protocol: str
    url: str
    model: str
    concurrency: int | None
    request_rate: float | None
    batch_size: int
    seconds: float
    requests: int
    throughput: float
    infer_per_s: float
    latency_ms: dict[str, float]
    errors: dict[str, int]
    windows: int
    stable: bool | None
    """Whether the last windows met the stability rule; None when a fixed window count was asked (not checked)."""
    sent_per_s: float = math.nan
    late: int = 0
    dropped: int = 0
    client_cpu_pct: float = math.nan
    server: ServerSplit | None = None
    window_log: list[dict[str, float | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What went wrong around the measurement without ending it (e.g. the server's statistics were unreadable)."""

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def p(self, pct: int) -> float:
        return self.latency_ms[f"p{pct}"]

    def as_row(self) -> dict[str, Any]:
        """A flat row for CSV and tables."""
        row: dict[str, Any] = {
            "protocol": self.protocol,
            "model": self.model,
            "concurrency": self.concurrency if self.concurrency is not None else "",
            "request_rate": self.request_rate if self.request_rate is not None else "",
            "batch_size": self.batch_size,
            "throughput": round(self.throughput, 2),
            "infer_per_s": round(self.infer_per_s, 2),
            **{f"{k}_ms": round(v, 4) for k, v in self.latency_ms.items()},
            "requests": self.requests,
            "errors": self.error_count,
            "error_kinds": "; ".join(f"{k}={v}" for k, v in sorted(self.errors.items())),
            "windows": self.windows,
            "stable": self.stable,
            "sent_per_s": round(self.sent_per_s, 2),
            "late": self.late,
            "dropped": self.dropped,
            "client_cpu_pct": round(self.client_cpu_pct, 1),
        }
        s = self.server
        row.update(
            {
                "server_requests": s.requests if s else "",
                "avg_batch": round(s.avg_batch, 3) if s else "",
                "server_queue_us": round(s.queue_us, 1) if s else "",
                "server_compute_us": round(s.compute_us, 1) if s else "",
                "server_compute_input_us": round(s.compute_input_us, 1) if s else "",
                "server_compute_infer_us": round(s.compute_infer_us, 1) if s else "",
                "server_compute_output_us": round(s.compute_output_us, 1) if s else "",
                "server_request_us": round(s.request_us, 1) if s else "",
            }
        )
        return row

    def as_dict(self) -> dict[str, Any]:
        """Everything, nested, for JSON (NaN becomes None)."""
        out = asdict(self)
        if self.server is not None:
            out["server"] = {
                **asdict(self.server),
                "avg_batch": self.server.avg_batch,
                "compute_us": self.server.compute_us,
            }
        cleaned: dict[str, Any] = _no_nan(out)
        return cleaned


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


@dataclass(frozen=True)
class Progress:
    """Reported after each measurement window."""

    load: Load
    window: int
    throughput: float
    p99_ms: float
    errors: int
    stable: bool


ProgressFn = Callable[[Progress], None]


class _Recorder:
    """The window that completions are counted into; swapped at each boundary."""

    def __init__(self) -> None:
        self.window = Window(0.0)
        self.stop = False


async def _closed_worker(rec: _Recorder, transport: Transport, items: Sequence[Any], offset: int) -> None:
    i = offset
    n = len(items)
    clock = time.perf_counter
    while not rec.stop:
        payload = items[i % n]
        i += 1
        rec.window.sent += 1
        t0 = clock()
        error = await _send(transport, payload)
        elapsed = clock() - t0
        window = rec.window
        if error is None:
            window.latencies.append(elapsed)
        else:
            window.errors[error] += 1
            if error == CONNECTION_ERROR or error.startswith(CLIENT_ERROR):
                await asyncio.sleep(ERROR_PAUSE_S)


async def _open_loop(rec: _Recorder, transport: Transport, items: Sequence[Any], load: Load) -> None:
    """Poisson arrivals; each latency counts from the scheduled send time, so a late send shows in it."""
    assert load.request_rate is not None
    rng = random.Random(load.seed)
    clock = time.perf_counter
    pending: set[asyncio.Task[None]] = set()
    inflight = 0

    async def one(scheduled: float, payload: Any) -> None:
        nonlocal inflight
        try:
            error = await _send(transport, payload)
        finally:
            inflight -= 1
        window = rec.window
        if error is None:
            window.latencies.append(clock() - scheduled)
        else:
            window.errors[error] += 1

    i = 0
    next_t = clock()
    try:
        while not rec.stop:
            next_t += rng.expovariate(load.request_rate)
            await asyncio.sleep(max(0.0, next_t - clock()))
            window = rec.window
            if inflight >= load.max_inflight:
                window.dropped += 1
                continue
            if clock() - next_t > LATE_S:
                window.late += 1
            window.sent += 1
            inflight += 1
            task = asyncio.create_task(one(next_t, items[i % len(items)]))
            i += 1
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        for task in pending:
            task.cancel()


async def measure(
    target: Target, transport: Transport, stats: StatsReader, payloads: Payloads, load: Load,
    progress: ProgressFn | None = None,
) -> Result:  # fmt: skip
    """Run ``load`` on an open transport: warm up, then windows until stable (or the fixed count)."""
    rec = _Recorder()
    items = payloads.items
    if load.request_rate is not None:
        tasks = [asyncio.create_task(_open_loop(rec, transport, items, load))]
    else:
        tasks = [asyncio.create_task(_closed_worker(rec, transport, items, k)) for k in range(load.concurrency)]
    clock = time.perf_counter
    notes: list[str] = []

    async def snapshot(when: str) -> ServerCounters | None:
        counters = await stats.read()
        if counters is None and stats.problem:
            notes.append(f"server statistics unreadable {when}: {stats.problem}")
        return counters

    try:
        await asyncio.sleep(load.warmup_s)
        snapshots: list[ServerCounters | None] = [await snapshot("before window 1")]
        windows: list[Window] = []
        cpu0 = time.process_time()
        started = t0 = clock()
        rec.window = Window(0.0)
        limit = load.windows or load.max_windows
        stable = False
        while len(windows) < limit:
            await asyncio.sleep(load.window_s)
            # the statistics first, then the window ends: what completes while they are read counts on both sides,
            # so the server's and the client's counts differ by at most the requests in flight at each boundary
            snapshots.append(await snapshot(f"after window {len(windows) + 1}"))
            now = clock()
            done, rec.window = rec.window, Window(0.0)
            done.seconds, t0 = now - t0, now
            windows.append(done)
            stable = load.windows is None and is_stable(windows, load.stability_pct)
            if progress is not None:
                done.latencies.sort()
                progress(Progress(load, len(windows), done.throughput, 1000 * percentile(done.latencies, 99),
                                  sum(done.errors.values()), stable))  # fmt: skip
            if stable:
                break
        wall = clock() - started
        cpu = time.process_time() - cpu0
    finally:
        rec.stop = True
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    used = windows if load.windows else windows[-STABLE_WINDOWS:]
    total = merge(used)
    total.latencies.sort()
    lat_ms = {f"p{p}": 1000 * percentile(total.latencies, p) for p in PERCENTILES}
    lat_ms["avg"] = 1000 * total.mean_latency
    lat_ms["min"] = 1000 * total.latencies[0] if total.latencies else math.nan
    lat_ms["max"] = 1000 * total.latencies[-1] if total.latencies else math.nan
    first, last = snapshots[len(windows) - len(used)], snapshots[-1]
    server = ServerSplit.between(first, last) if first is not None and last is not None else None
    if server is None and notes:
        notes.append("no server-side split: the statistics around the measured windows could not be read")
    return Result(
        protocol=target.protocol,
        url=target.url,
        model=target.model,
        concurrency=None if load.request_rate is not None else load.concurrency,
        request_rate=load.request_rate,
        batch_size=payloads.batch_size,
        seconds=total.seconds,
        requests=len(total.latencies),
        throughput=total.throughput,
        infer_per_s=total.throughput * payloads.batch_size,
        latency_ms=lat_ms,
        errors=dict(total.errors),
        windows=len(windows),
        stable=None if load.windows else stable,
        sent_per_s=total.sent / total.seconds if total.seconds else math.nan,
        late=total.late,
        dropped=total.dropped,
        client_cpu_pct=100.0 * cpu / wall if wall else math.nan,
        server=server,
        window_log=[
            {
                "seconds": w.seconds,
                "throughput": w.throughput,
                "avg_ms": 1000 * w.mean_latency,
                "errors": sum(w.errors.values()),
                "server_requests": _server_requests(before, after),
            }
            for w, before, after in zip(windows, snapshots, snapshots[1:], strict=False)
        ],
        notes=notes,
    )


def _server_requests(before: ServerCounters | None, after: ServerCounters | None) -> float | None:
    """The requests the server counted during one window; None when a snapshot around it is missing."""
    if before is None or after is None:
        return None
    return float(ServerSplit.between(before, after).requests)


def _event_loop_runner() -> Callable[[Any], Any]:
    """uvloop's runner when installed (it comes with uvicorn[standard]), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def _sweep_async(
    target: Target, loads: Sequence[Load], payloads: Payloads, progress: ProgressFn | None
) -> list[Result]:
    timeout = max(load.timeout_s for load in loads)
    transport = open_transport(target, timeout)
    stats = StatsReader(target, transport)
    try:
        return [await measure(target, transport, stats, payloads, load, progress) for load in loads]
    finally:
        await stats.close()
        await transport.close()


def sweep(
    target: Target,
    loads: Sequence[Load],
    inputs: InputSpec | None = None,
    progress: ProgressFn | None = None,
    payloads: Payloads | None = None,
) -> list[Result]:
    """Measure each load level in turn on one set of connections. ``payloads`` (from ``prepare``) skips reading
    the model's metadata again; they must have been prepared for the same host and port."""
    payloads = payloads or prepare(target, inputs)
    results: list[Result] = _event_loop_runner()(_sweep_async(target, loads, payloads, progress))
    return results


def run(
    target: Target,
    load: Load,
    inputs: InputSpec | None = None,
    progress: ProgressFn | None = None,
    payloads: Payloads | None = None,
) -> Result:
    """Measure one load level."""
    return sweep(target, [load], inputs, progress, payloads)[0]
