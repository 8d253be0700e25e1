"""Streamed responses of a decoupled python model over gRPC ``ModelStreamInfer``: responses/s and time to first
response.

    python -m loadtests.bench_decoupled                          # N = 1, 16, 128 responses; concurrency 1, 8, 32
    python -m loadtests.bench_decoupled --n 64 --concurrency 4 --duration 5 --engine grpcio
    python -m loadtests.bench_decoupled --n 16 --concurrency 1 8 --pause-us 1000   # 1 ms of "compute" per token

One ``modelsvc serve`` (gRPC engine ``h2``, or ``grpcio``) serves ``tokens``, a decoupled python model
(``max_batch_size: 8``, ``dynamic_batching {}``, one CPU instance) that answers a request with N responses, each
an INT32 [1, 1] "token", all sent from ``execute`` as fast as it can (``--pause-us``: after sleeping that long
before each, as a model computing its tokens would): the numbers are the server's cost per streamed response,
not a model's. Each of C clients holds one stream (grpc.aio, the generated stub, on one
channel) and sends its next request as soon as the final response of the last one arrived (closed loop), for
``--duration`` seconds per point after a short warmup. Time to first response: from the request's write to its
first response; stream: from the write to the final response. Server CPU: the server process's CPU time over the
point, per response. The client runs in this process, on the same machine: at high rates it shares the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtests.harness import _servers

CONFIG = """name: "tokens"
backend: "python"
max_batch_size: 8
dynamic_batching {}
model_transaction_policy { decoupled: true }
input [
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PAUSE_US" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

MODEL = """import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            pause = int(pb_utils.get_input_tensor_by_name(request, "PAUSE_US").as_numpy().reshape(-1)[0])
            for i in range(n):
                if pause:
                    time.sleep(pause / 1e6)
                token = pb_utils.Tensor("TOKEN", np.array([[i]], np.int32))
                sender.send(pb_utils.InferenceResponse([token]), flags=FINAL if i == n - 1 else 0)
        return None
"""

RESPONSES = (1, 16, 128)
CONCURRENCY = (1, 8, 32)


def write_repo(repo: Path) -> None:
    (repo / "tokens" / "1").mkdir(parents=True)
    (repo / "tokens" / "config.pbtxt").write_text(CONFIG)
    (repo / "tokens" / "1" / "model.py").write_text(MODEL)


def request(n: int, pause_us: int = 0) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="tokens")
    for name, value in (("N", n), ("PAUSE_US", pause_us)):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 1])
        message.raw_input_contents.append(np.array([[value]], np.int32).tobytes())
    return message


@dataclass
class Point:
    n: int
    concurrency: int
    seconds: float = 0.0
    requests: int = 0
    responses: int = 0
    errors: int = 0
    first_ms: list[float] = field(default_factory=list)
    stream_ms: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0


async def client(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, n: int, until: float, point: Point | None, pause_us: int = 0
) -> None:
    """One stream: a request, its N responses, the next request, ... until ``until`` (perf_counter)."""
    call = stub.ModelStreamInfer()
    message = request(n, pause_us)
    try:
        while time.perf_counter() < until:
            sent = time.perf_counter()
            await call.write(message)
            first = None
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    raise RuntimeError("the server ended the stream")
                if first is None:
                    first = time.perf_counter()
                if point is not None:
                    point.responses += 1
                    point.errors += bool(answer.error_message)
                if answer.infer_response.parameters["triton_final_response"].bool_param:
                    break
            if point is not None:
                point.requests += 1
                point.first_ms.append((first - sent) * 1e3)
                point.stream_ms.append((time.perf_counter() - sent) * 1e3)
        await call.done_writing()
    finally:
        call.cancel()


async def measure(url: str, n: int, concurrency: int, duration: float, server_pid: int, pause_us: int = 0) -> Point:
    point = Point(n, concurrency)
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        warm_until = time.perf_counter() + min(1.0, duration / 3)
        await asyncio.gather(*(client(stub, n, warm_until, None, pause_us) for _ in range(concurrency)))
        cpu0 = _servers.tree_cpu_seconds(server_pid)
        start = time.perf_counter()
        await asyncio.gather(*(client(stub, n, start + duration, point, pause_us) for _ in range(concurrency)))
        point.seconds = time.perf_counter() - start
        point.server_cpu_s = _servers.tree_cpu_seconds(server_pid) - cpu0
    return point


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(points: list[Point]) -> str:
    head = (
        "| N | concurrency | requests/s | responses/s | first response p50 ms | p99 ms | whole stream p50 ms | "
        "server CPU us/response | errors |"
    )
    rows = [head, "|" + "---|" * 9]
    for p in points:
        rate = p.responses / p.seconds if p.seconds else 0.0
        cpu_us = p.server_cpu_s / p.responses * 1e6 if p.responses else float("nan")
        rows.append(
            f"| {p.n} | {p.concurrency} | {p.requests / p.seconds:,.0f} | {rate:,.0f} | "
            f"{percentile(p.first_ms, 0.5):.2f} | {percentile(p.first_ms, 0.99):.2f} | "
            f"{statistics.median(p.stream_ms) if p.stream_ms else float('nan'):.2f} | {cpu_us:.0f} | {p.errors} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=list(RESPONSES), help="responses per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY), help="streams at once")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per point")
    parser.add_argument("--engine", choices=("h2", "grpcio"), default="h2", help="the server's gRPC engine")
    parser.add_argument(
        "--pause-us", type=int, default=0, help="the model sleeps this long before each response (a token's compute)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-decoupled-") as tmp:
        repo = Path(tmp)
        write_repo(repo)
        server = _servers.modelsvc_server(repo)
        server.argv += ["--grpc-address", "127.0.0.1", "--grpc-engine", args.engine]
        with server:
            assert server.proc is not None
            points = []
            for n in args.n:
                for concurrency in args.concurrency:
                    point = asyncio.run(
                        measure(server.grpc_url, n, concurrency, args.duration, server.proc.pid, args.pause_us)
                    )
                    points.append(point)
                    print(f"N={n} c={concurrency}: {point.responses / point.seconds:,.0f} responses/s", file=sys.stderr)
    pause = f", the model pauses {args.pause_us} us before each response" if args.pause_us else ""
    print(f"decoupled python model, gRPC engine {args.engine}, {args.duration:g} s per point{pause}")
    print(table(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
