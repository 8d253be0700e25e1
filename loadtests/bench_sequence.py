"""The sequence batcher under 64 concurrent sequences: the direct strategy against the oldest, sequences/s and steps/s.

    python -m loadtests.bench_sequence                         # 64 sequences x 16 steps, ONNX and python, 8 s a point
    python -m loadtests.bench_sequence --sequences 128 --steps 32 --seconds 5 --backends onnx

One ``modelsvc serve`` serves a running sum kept as implicit state (``SUM_IN`` -> ``SUM_OUT``, FP32 [1]) in two
backends (ONNX Runtime: a 5-node graph; python: a numpy model) and two strategies, ``max_batch_size: 8`` and one
CPU instance each: ``direct`` (8 sequence slots: beyond 8 live sequences the rest wait in the backlog) and
``oldest`` (``max_candidate_sequences: 64``, no queue delay: each batch takes the oldest request of up to 8
candidate sequences). The model costs almost nothing, so the numbers are the scheduler's and the protocol's.

The client (this process, grpc.aio with the generated stub, one channel) keeps ``--sequences`` sequences in
flight: each runs ``--steps`` requests one after the other (START on the first, END on the last, the next sent
when the last answered), then a new sequence id starts, until ``--seconds`` have passed; the sequences under way
then finish. Every answer is checked against the running sum (``wrong+failed``: mismatches and failed
requests). sequences/s and steps/s divide what finished by the time until the last one did; latency is each
step's round trip; ``batch`` is the mean rows per execution from the server's statistics (inference_count /
execution_count).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtests.harness import _servers

BACKENDS = ("onnx", "python")
STRATEGIES = ("direct", "oldest")
MAX_BATCH = 8

_SEQUENCE_BATCHING = """sequence_batching {{
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}"""
CONFIG = """name: "{name}"
backend: "{backend}"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{batching}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
STRATEGY_TEXT = {
    "direct": "direct { }",
    "oldest": "oldest { max_candidate_sequences: 64 }",
}
PYTHON_MODEL = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT = SUM_OUT = (SUM_IN * (1 - START) + INPUT) * READY, per request."""

    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            total = ((get("SUM_IN") * (1 - get("START")) + get("INPUT")) * get("READY")).astype(np.float32)
            outputs = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("SUM_OUT", total)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''


def onnx_sum_model() -> Any:
    """OUTPUT = (SUM_IN * (1 - START) + INPUT) * READY; SUM_OUT = OUTPUT (all [batch, 1] FP32)."""
    from modelsvc.tools.onnx_models import _model

    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["SUM_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["summed"]),
        helper.make_node("Mul", ["summed", "READY"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["SUM_OUT"]),
    ]
    io = [helper.make_tensor_value_info(n, f, ["batch", 1]) for n in ("INPUT", "START", "READY", "SUM_IN")]
    outs = [helper.make_tensor_value_info(n, f, ["batch", 1]) for n in ("OUTPUT", "SUM_OUT")]
    one = helper.make_tensor("one", f, [1], [1.0])
    return _model(helper.make_graph(nodes, "onnx_sum", io, outs, initializer=[one]))


def model_name(backend: str, strategy: str) -> str:
    return f"sum_{backend}_{strategy}"


def write_repo(repo: Path) -> None:
    from modelsvc.tools.onnx_models import write_model

    for backend, strategy in itertools.product(BACKENDS, STRATEGIES):
        name = model_name(backend, strategy)
        batching = _SEQUENCE_BATCHING.format(strategy=STRATEGY_TEXT[strategy])
        engine = "onnxruntime" if backend == "onnx" else "python"
        config = CONFIG.format(name=name, backend=engine, mbs=MAX_BATCH, batching=batching)
        if backend == "onnx":
            write_model(repo, name, onnx_sum_model(), config)
        else:
            (repo / name / "1").mkdir(parents=True, exist_ok=True)
            (repo / name / "1" / "model.py").write_text(PYTHON_MODEL)
            (repo / name / "config.pbtxt").write_text(config)


@dataclass
class Point:
    backend: str
    strategy: str
    sequences: int = 0
    steps: int = 0
    wrong: int = 0
    errors: int = 0
    seconds: float = 0.0
    batch: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def row(self) -> list[str]:
        lat = sorted(self.latencies) or [0.0]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return [
            self.backend,
            self.strategy,
            f"{self.sequences / self.seconds:.1f}",
            f"{self.steps / self.seconds:.0f}",
            f"{statistics.median(lat) * 1000:.2f}",
            f"{p99 * 1000:.2f}",
            f"{self.batch:.2f}",
            str(self.wrong + self.errors),
        ]


def _request(model: str, sid: int, value: float, start: bool, end: bool) -> Any:
    req = service_pb2.ModelInferRequest(model_name=model)
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "INPUT", "FP32"
    tensor.shape.extend([1, 1])
    req.raw_input_contents.append(np.array([[value]], dtype=np.float32).tobytes())
    req.parameters["sequence_id"].int64_param = sid
    req.parameters["sequence_start"].bool_param = start
    req.parameters["sequence_end"].bool_param = end
    return req


async def _client(stub: Any, point: Point, model: str, ids: Any, steps: int, deadline: float) -> None:
    while time.perf_counter() < deadline:
        sid = next(ids)
        total = 0.0
        for i in range(steps):
            value = float(i % 5 + 1)
            total += value
            t0 = time.perf_counter()
            try:
                answer = await stub.ModelInfer(_request(model, sid, value, i == 0, i == steps - 1))
            except grpc.aio.AioRpcError:
                point.errors += 1
                break
            point.latencies.append(time.perf_counter() - t0)
            point.steps += 1
            if float(np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)[0]) != total:
                point.wrong += 1
        else:
            point.sequences += 1


def _counts(base_url: str, model: str) -> tuple[int, int]:
    stats = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


async def measure(server: _servers.ServerProcess, backend: str, strategy: str, args: argparse.Namespace) -> Point:
    model = model_name(backend, strategy)
    ids = itertools.count(1_000_000 * (1 + BACKENDS.index(backend) * 2 + STRATEGIES.index(strategy)))
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        warm = Point(backend, strategy)
        await asyncio.gather(*(_client(stub, warm, model, ids, 4, time.perf_counter() + 0.5) for _ in range(8)))
        before = _counts(server.base_url, model)
        point = Point(backend, strategy)
        start = time.perf_counter()
        deadline = start + args.seconds
        await asyncio.gather(*(_client(stub, point, model, ids, args.steps, deadline) for _ in range(args.sequences)))
        point.seconds = time.perf_counter() - start
    after = _counts(server.base_url, model)
    executions = after[1] - before[1]
    point.batch = (after[0] - before[0]) / executions if executions else 0.0
    return point


def table(points: list[Point]) -> str:
    head = ["backend", "strategy", "sequences/s", "steps/s", "p50 ms", "p99 ms", "batch", "wrong+failed"]
    rows = [head, *(p.row() for p in points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_sequence", description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=64, help="sequences in flight at once (default 64)")
    parser.add_argument("--steps", type=int, default=16, help="requests per sequence (default 16)")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each point starts new sequences")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sequence-") as tmp:
        repo = Path(tmp) / "models"
        write_repo(repo)
        with _servers.modelsvc_server(repo) as server:
            points = []
            for backend in args.backends:
                for strategy in STRATEGIES:
                    points.append(asyncio.run(measure(server, backend, strategy, args)))
                    print(f"  {backend} {strategy}: done", file=sys.stderr, flush=True)
    print(
        f"{args.sequences} concurrent sequences x {args.steps} steps, gRPC, {args.seconds:g} s of new sequences "
        "per point, max_batch_size 8, one CPU instance"
    )
    print(table(points))
    return 1 if any(p.wrong or p.errors for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
