"""gRPC against HTTP on the same modelsvc server: perf_analyzer ``-i grpc`` and ``-i http``, interleaved.

    python -m loadtests.bench_grpc                      # 3 rounds, c=1/8/32, python and ONNX identity models
    python -m loadtests.bench_grpc --before /tmp/base   # also a server run from another checkout, same rounds

One ``modelsvc serve`` (two with ``--before``: the other one runs ``python -m modelsvc`` from that folder) serves
two identity models on FP32 [1,16] (``max_batch_size: 8``, ``dynamic_batching {}``, one CPU instance): one in the
python backend, one in ONNX Runtime. Each round measures every (model, concurrency) point over both protocols on
every server, back to back, the order of the protocols alternating from round to round. The table gives the
median inferences/s of each protocol and the median of the rounds' gRPC / HTTP ratios (the issue's target: 0.8).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import _perf, _servers

CONFIG = """\
name: "{name}"
{engine}
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MODELS = ("identity_py", "identity_onnx")
CONCURRENCY = (1, 8, 32)
PROTOCOLS = ("grpc", "http")
TARGET = 0.8


def write_repo(repo: Path) -> None:
    from modelsvc.tools.onnx_models import identity, write_model

    _servers.write_triton_identity(repo, "identity_py", CONFIG.format(name="identity_py", engine='backend: "python"'))
    write_model(
        repo, "identity_onnx", identity(), CONFIG.format(name="identity_onnx", engine='platform: "onnxruntime_onnx"')
    )


class Served(_servers.ServerProcess):
    """``modelsvc serve`` with its gRPC port known; ``checkout``: run that folder's modelsvc instead of ours."""

    def __init__(self, label: str, repo: Path, checkout: Path | None) -> None:
        self.label = label
        grpc_port = _servers.free_port()
        http = _servers.free_port()
        env = None
        if checkout is None:
            exe = _servers.modelsvc_executable()
            if exe is None:
                raise RuntimeError("modelsvc console script not found: run `.venv/bin/pip install -e . --no-deps`")
            head = [str(exe)]
        else:
            head = [sys.executable, "-m", "modelsvc"]
            env = dict(os.environ, PYTHONPATH=str(checkout))
        argv = [
            *head, "serve",
            "--model-repository", str(repo),
            "--http-address", "127.0.0.1", "--http-port", str(http),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
            "--allow-metrics", "false",
        ]  # fmt: skip
        super().__init__(f"modelsvc-{label}", argv, http, env, cwd=checkout)
        self.grpc_port = grpc_port

    def target(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port}" if protocol == "grpc" else self.url


@dataclass
class Point:
    rates: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PROTOCOLS})
    ratios: list[float] = field(default_factory=list)


def measure(server: Served, model: str, concurrency: int, protocol: str, workdir: Path) -> float:
    result, output, cmd = _perf.run_perf_analyzer(
        model, server.target(protocol), concurrency, workdir, protocol=protocol
    )
    if result is None:
        raise RuntimeError(f"perf_analyzer failed: {shlex.join(cmd)}\n{output[-3000:]}")
    return result.infer_per_s


def run(
    servers: Sequence[Served], models: Sequence[str], concurrency: Sequence[int], rounds: int, workdir: Path
) -> dict[tuple[str, str, int], Point]:
    points: dict[tuple[str, str, int], Point] = {}
    for r in range(rounds):
        order = PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]
        for model in models:
            for c in concurrency:
                for server in servers if r % 2 == 0 else servers[::-1]:
                    point = points.setdefault((server.label, model, c), Point())
                    got = {p: measure(server, model, c, p, workdir) for p in order}
                    for p, rate in got.items():
                        point.rates[p].append(rate)
                    point.ratios.append(got["grpc"] / got["http"])
                    print(
                        f"round {r + 1} {server.label:>6} {model:<14} c={c:<3} grpc {got['grpc']:8.0f}  "
                        f"http {got['http']:8.0f}  ratio {got['grpc'] / got['http']:.2f}",
                        flush=True,
                    )
    return points


def print_table(points: dict[tuple[str, str, int], Point], rounds: int) -> None:
    print(f"\nmedians of {rounds} interleaved rounds (perf_analyzer, binary tensors, infer/s)\n")
    print("| server | model | c | gRPC infer/s | HTTP infer/s | gRPC / HTTP (rounds) | median |")
    print("|---|---|---:|---:|---:|---|---:|")
    for (label, model, c), p in points.items():
        rounds_text = ", ".join(f"{x:.2f}" for x in p.ratios)
        ratio = statistics.median(p.ratios)
        mark = "" if ratio >= TARGET else " (below 0.8)"
        print(
            f"| {label} | {model} | {c} | {statistics.median(p.rates['grpc']):,.0f} | "
            f"{statistics.median(p.rates['http']):,.0f} | {rounds_text} | {ratio:.2f}{mark} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    parser.add_argument("--before", type=Path, help="a checkout whose modelsvc is measured beside this one")
    args = parser.parse_args(argv)
    problem = _perf.perf_analyzer_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    _perf.WINDOW_MS = args.window_ms
    with tempfile.TemporaryDirectory(prefix="bench_grpc-") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo)
        servers = [Served("after" if args.before else "this", repo, None)]
        if args.before:
            servers.append(Served("before", repo, args.before.resolve()))
        for s in servers:
            s.__enter__()
        try:
            points = run(servers, args.models, args.concurrency, args.rounds, Path(tmp))
        finally:
            for s in servers:
                s.__exit__(None, None, None)
    print_table(points, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
