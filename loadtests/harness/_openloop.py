"""An open-loop load generator for the soak and overload scripts: requests start at a target rate (Poisson or
fixed intervals) whatever the answers take, one long document per request to doc_classifier's /v1/classify;
each request's scheduled send time, outcome, latency and Retry-After are recorded. Also the closed-loop ramp
that measures the pair's capacity, and the markdown tables both scripts print.

Latency is measured from the time the request was due, not from when the generator got to send it, so a
generator that falls behind shows as latency (and as ``lag``), never hides it."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness._documents import TOKENS_PER_WORD, long_documents
from loadtests.harness._pair_procs import ROUTE

KINDS = ("2xx", "503", "429", "504", "other", "transport", "lost")
"""What became of a request: its status class, a transport error (refused, reset), or no answer within the cap."""


def request_bodies(words: int, count: int = 24, seed: int = 17) -> list[bytes]:
    """``count`` JSON bodies of one document each, about ``words`` words (within 5%), labels in turn."""
    tokens = round(words * TOKENS_PER_WORD)
    docs = long_documents(count, round(tokens * 0.95), round(tokens * 1.05), seed=seed)
    return [json.dumps({"documents": [text]}).encode() for _, text in docs]


def deadline_headers(deadline_s: float | None, style: str) -> dict[str, str]:
    """The caller's deadline as logicd reads it: ``Request-Timeout: 1.0`` or ``grpc-timeout: 1000m``."""
    if deadline_s is None:
        return {}
    if style == "grpc-timeout":
        return {"grpc-timeout": f"{max(1, round(deadline_s * 1000))}m"}
    return {"Request-Timeout": f"{deadline_s:g}"}


@dataclass
class Record:
    due: float
    """When the request was due, seconds since the run started."""
    kind: str
    latency_s: float
    """From ``due`` to the answer (or to the error, or to the cap)."""
    lag_s: float
    """How late the generator sent it."""
    retry_after: bool
    """A Retry-After header came with the answer."""

    @property
    def done(self) -> float:
        return self.due + self.latency_s


def kind_of(status: int) -> str:
    if 200 <= status < 300:
        return "2xx"
    return str(status) if str(status) in KINDS else "other"


@dataclass
class OpenLoop:
    """Sends ``bodies`` in turn to ``url`` + /v1/classify at ``rate`` requests/s (a function of the time since the
    start, so phases can change it); ``records`` fills as answers come."""

    url: str
    bodies: Sequence[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    poisson: bool = True
    lost_s: float = 120.0
    seed: int = 0
    records: list[Record] = field(default_factory=list)
    in_flight: int = 0
    t0: float = 0.0

    async def run(self, rate: Callable[[float], float], seconds: float) -> None:
        """Send for ``seconds``, then wait for every answer (each capped at ``lost_s``)."""
        rng = random.Random(self.seed)
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
        headers = {"content-type": "application/json", **self.headers}
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()  # set before the first await: a sampler started beside run() reads it
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=None, headers=headers) as client:
            due, i = 0.0, 0
            while True:
                r = rate(due)
                step = (rng.expovariate(r) if self.poisson else 1.0 / r) if r > 0 else 0.1
                due += step
                if due >= seconds:
                    break
                delay = self.t0 + due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if r <= 0:
                    continue
                task = asyncio.create_task(self._one(client, self.bodies[i % len(self.bodies)], due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            if tasks:
                await asyncio.wait(set(tasks))

    async def _one(self, client: httpx.AsyncClient, body: bytes, due: float) -> None:
        loop = asyncio.get_running_loop()
        lag = loop.time() - self.t0 - due
        self.in_flight += 1
        kind, retry_after = "lost", False
        try:
            response = await asyncio.wait_for(client.post(ROUTE, content=body), self.lost_s - lag)
            kind, retry_after = kind_of(response.status_code), "retry-after" in response.headers
        except TimeoutError:
            pass
        except httpx.HTTPError:
            kind = "transport"
        finally:
            self.in_flight -= 1
        self.records.append(Record(due, kind, loop.time() - self.t0 - due, lag, retry_after))


def run_open_loop(loop: OpenLoop, rate: Callable[[float], float], seconds: float) -> None:
    asyncio.run(loop.run(rate, seconds))


# ---------------------------------------------------------------------------------------------------------
# capacity


@dataclass(frozen=True)
class RampStep:
    concurrency: int
    ok: int
    errors: int
    per_s: float
    p50_ms: float


async def _closed(url: str, bodies: Sequence[bytes], concurrency: int, seconds: float) -> RampStep:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300.0) as client:
        end = time.monotonic() + seconds

        async def worker(k: int) -> None:
            nonlocal errors
            i = k
            while time.monotonic() < end:
                t = time.monotonic()
                try:
                    response = await client.post(
                        ROUTE, content=bodies[i % len(bodies)], headers={"content-type": "application/json"}
                    )
                    if response.status_code == 200:
                        latencies.append(time.monotonic() - t)
                    else:
                        errors += 1
                        await asyncio.sleep(0.05)  # a refused request must not spin the loop
                except httpx.HTTPError:
                    errors += 1
                i += concurrency

        start = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed = time.monotonic() - start
    return RampStep(concurrency, len(latencies), errors, len(latencies) / elapsed, percentile(latencies, 50) * 1000)


def measure_capacity(url: str, bodies: Sequence[bytes], step_s: float = 10.0, max_concurrency: int = 16
                     ) -> tuple[float, list[RampStep]]:  # fmt: skip
    """Closed-loop ramp (1, 2, 4, ... concurrent clients, ``step_s`` each, after a warm-up request per body): the
    pair's capacity is the highest 2xx rate seen. 1, 2 and 4 clients always run (on a shared machine one step can
    come out low); past 4 the ramp stops when doubling the clients adds less than 5%."""
    with httpx.Client(base_url=url, timeout=300.0) as client:
        for body in bodies[:4]:
            client.post(ROUTE, content=body, headers={"content-type": "application/json"}).raise_for_status()
    steps: list[RampStep] = []
    c = 1
    while c <= max_concurrency:
        steps.append(asyncio.run(_closed(url, bodies, c, step_s)))
        print(f"  capacity ramp: {c} clients -> {steps[-1].per_s:.2f} req/s", flush=True)
        if c >= 4 and steps[-1].per_s < 1.05 * max(s.per_s for s in steps[:-1]):
            break
        c *= 2
    return max(s.per_s for s in steps), steps


# ---------------------------------------------------------------------------------------------------------
# statistics and tables


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table, columns padded; the first column left-aligned, the rest right-aligned."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 2)) if i == 0 else ("-" * (w + 1) + ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def ramp_table(steps: Sequence[RampStep]) -> str:
    return markdown_table(
        ["clients", "2xx", "errors", "req/s", "p50 ms"],
        [[s.concurrency, s.ok, s.errors, f"{s.per_s:.2f}", f"{s.p50_ms:.0f}"] for s in steps],
    )


# ---------------------------------------------------------------------------------------------------------
# the options both scripts share


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("load")
    group.add_argument("--capacity", type=float, help="the pair's capacity in req/s (default: a closed-loop ramp)")
    group.add_argument("--ramp-s", type=float, default=10.0, help="seconds per step of the capacity ramp (10)")
    group.add_argument("--words", type=int, default=1500, help="words per document, one per request (1500)")
    group.add_argument("--fixed", action="store_true", help="fixed intervals between requests (default: Poisson)")
    group.add_argument("--lost-s", type=float, default=120.0,
                       help="a request with no answer after this many seconds is counted lost (120)")  # fmt: skip
    group.add_argument("--seed", type=int, default=0, help="seed of the arrival times (0)")
    group.add_argument("--json", type=Path, help="also write the results as JSON to this file")


def check_load_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.capacity is not None and not args.capacity > 0:
        parser.error("--capacity must be a positive number of requests per second")
    if args.words < 10:
        parser.error("--words must be at least 10")
    if not args.lost_s > 0 or not args.ramp_s > 0:
        parser.error("--lost-s and --ramp-s must be positive")


def capacity_of(args: argparse.Namespace, url: str, bodies: Sequence[bytes]) -> tuple[float, list[RampStep]]:
    """``--capacity``, or measured by the closed-loop ramp."""
    if args.capacity is not None:
        return args.capacity, []
    print(f"measuring the pair's capacity (closed loop, {args.ramp_s:g} s per step)", flush=True)
    return measure_capacity(url, bodies, args.ramp_s)


def _no_nan(value: Any) -> Any:
    """NaN (a percentile of nothing) as null, so the file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(_no_nan(data), indent=2, allow_nan=False) + "\n")
        print(f"JSON written to {path}")
