"""The typed client's sequences and streams, and logicd's server-sent events, on real processes.

    python -m loadtests.bench_edge [--seconds 5] [--responses 32] [--sequences 64] [--steps 8]

Rows:
- ``stream grpc``: ``AsyncClient.stream_infer`` on the decoupled ``countdown`` model (tests/data/edge_stream),
  ``--responses`` responses per request, 1 and 8 streams at once, closed loop;
- ``stream sse``: the same through ``logicd serve`` (a route returning ``ctx.stream``) read with httpx as
  server-sent events: what the logic server adds;
- ``sequence http`` / ``sequence grpc``: ``--sequences`` concurrent ``client.sequence`` of ``--steps`` steps
  each on seq's python models ``accumulate`` (direct strategy, 2 slots) and ``accumulate_oldest`` (oldest,
  8 candidates, batches of 4), one round each, generated integer ids.

Columns: calls (streams or sequences) per second, responses (or steps) per second, time to the first response
(p50/p99, ms; for sequences: each step's latency). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np

from loadtests.harness._servers import ROOT, logicd_server, modelsvc_server
from modelsvc.client import AsyncClient

STREAM_REPO = ROOT / "tests" / "data" / "edge_stream"
SEQUENCE_REPO = ROOT / "tests" / "data" / "seq_models"

SERVICE = """
import numpy as np
from litestar.response import ServerSentEvent
from msgspec import Struct
from logicd import Context, Service


class Count(Struct):
    n: int


service = Service()


@service.post("/v1/count")
async def count(request: Count, ctx: Context) -> ServerSentEvent:
    return await ctx.stream("countdown", {"N": np.array([request.n], np.int32)}, render=lambda r: int(r["OUT"][0]))
"""

YAML = """name: bench-edge
service: bench_edge_service:service
model_service:
  url: grpc://127.0.0.1:1
  timeout_s: 60
models: [countdown]
admission:
  max_in_flight: 64   # a stream holds its slot to its end; the automatic limit (from the model's capacity) is 2 here
"""


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


async def _closed_loop(
    one: Callable[[], Awaitable[tuple[float, int]]], concurrency: int, seconds: float
) -> tuple[int, int, list[float], float]:
    """``concurrency`` workers calling ``one`` (-> time to first response, responses) until ``seconds`` pass."""
    firsts: list[float] = []
    calls = responses = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal calls, responses
        while time.monotonic() < end:
            first, count = await one()
            firsts.append(first)
            calls += 1
            responses += count

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return calls, responses, firsts, time.monotonic() - start


async def _stream_rows(grpc_url: str, sse_url: str, n: int, seconds: float) -> list[str]:
    rows = []
    async with AsyncClient(grpc_url) as client, httpx.AsyncClient(base_url=sse_url, timeout=60) as http:

        async def grpc_one() -> tuple[float, int]:
            start = time.perf_counter()
            first = 0.0
            count = 0
            async for _ in client.stream_infer("countdown", {"N": np.array([n], np.int32)}):
                if not count:
                    first = time.perf_counter() - start
                count += 1
            return first, count

        async def sse_one() -> tuple[float, int]:
            start = time.perf_counter()
            first = 0.0
            count = 0
            async with http.stream("POST", "/v1/count", json={"n": n}) as answer:
                async for line in answer.aiter_lines():
                    if line.startswith("data:"):
                        if not count:
                            first = time.perf_counter() - start
                        count += 1
            return first, count

        for name, one in (("stream grpc", grpc_one), ("stream sse", sse_one)):
            await one()  # warm
            for concurrency in (1, 8):
                calls, responses, firsts, took = await _closed_loop(one, concurrency, seconds)
                assert responses == calls * n, (name, responses, calls)
                rows.append(
                    f"| {name} | {n} | {concurrency} | {calls / took:.1f} | {responses / took:.0f} | "
                    f"{_pct(firsts, 50):.1f} | {_pct(firsts, 99):.1f} |"
                )
    return rows


async def _sequence_row(url: str, name: str, model: str, sequences: int, steps: int) -> str:
    latencies: list[float] = []
    async with AsyncClient(url) as client:

        async def one() -> None:
            async with client.sequence(model) as seq:
                for i in range(steps):
                    start = time.perf_counter()
                    await seq.infer(INPUT=np.array([[1]], np.int32), end=i == steps - 1)
                    latencies.append(time.perf_counter() - start)

        await one()  # warm
        latencies.clear()
        start = time.monotonic()
        await asyncio.gather(*(one() for _ in range(sequences)))
        took = time.monotonic() - start
    return (
        f"| {name} | {steps} steps | {sequences} | {sequences / took:.1f} | {sequences * steps / took:.0f} | "
        f"{_pct(latencies, 50):.1f} | {_pct(latencies, 99):.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--responses", type=int, default=32)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    rows = [
        "| path | per call | concurrent | calls/s | responses/s | first p50 ms | first p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder, modelsvc_server(STREAM_REPO) as models:
        service = Path(folder)
        (service / "bench_edge_service.py").write_text(SERVICE)
        (service / "service.yaml").write_text(YAML)
        grpc_url = f"grpc://127.0.0.1:{models.grpc_port}"
        with logicd_server(service, grpc_url) as logic:
            rows += asyncio.run(_stream_rows(grpc_url, logic.base_url, args.responses, args.seconds))
    with modelsvc_server(SEQUENCE_REPO) as models:
        grpc_url = f"grpc://127.0.0.1:{models.grpc_port}"
        for model, strategy in (("accumulate", "direct"), ("accumulate_oldest", "oldest")):
            for scheme, url in (("http", models.base_url), ("grpc", grpc_url)):
                name = f"sequence {scheme} {strategy}"
                rows.append(asyncio.run(_sequence_row(url, name, model, args.sequences, args.steps)))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
