"""gRPC against HTTP on the same modelsvc server: perf_analyzer ``-i grpc`` and ``-i http``, interleaved.

    python -m loadtests.bench_grpc                      # 3 rounds, c=1/8/32, python and ONNX identity models
    python -m loadtests.bench_grpc --before /tmp/base   # also a server run from another checkout, same rounds
    python -m loadtests.bench_grpc --before /tmp/base --after /tmp/new   # two other checkouts
    python -m loadtests.bench_grpc --models large_onnx --concurrency 1 2   # FP32 [1, 1M]: 4 MiB each way

One ``modelsvc serve`` (two with ``--before``: the other one runs ``python -m modelsvc`` from that folder) serves
two identity models on FP32 [1,16] (``max_batch_size: 8``, ``dynamic_batching {}``, one CPU instance): one in the
python backend, one in ONNX Runtime; and ``large_onnx`` (on request) for FP32 [1, 1M] tensors. Each round
measures every (model, concurrency) point over both protocols on every server, back to back, the order of the
protocols alternating from round to round. The table gives the median inferences/s of each protocol and the
median of the rounds' gRPC / HTTP ratios (the issue's target: 0.8).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.grid._models import CONFIG, ENGINES
from loadtests.harness import _perf, _servers

MODELS = ("identity_py", "identity_onnx", "large_onnx")
DEFAULT_MODELS = ("identity_py", "identity_onnx")
LARGE_ELEMENTS = 1 << 20
"""large_onnx: FP32 [1, 1M] per request (4 MiB in, 4 MiB out), the issue's large-tensor row."""
SHAPES = {"large_onnx": [f"INPUT0:{LARGE_ELEMENTS}"]}
CONCURRENCY = (1, 8, 32)
PROTOCOLS = ("grpc", "http")
TARGET = 0.8


def write_repo(repo: Path) -> None:
    from modelsvc.tools.onnx_models import identity, write_model

    def config(name: str, engine: str, dim: int = 16) -> str:
        return CONFIG.format(name=name, engine=ENGINES[engine], mbs=8, dim=dim, delay=0)

    _servers.write_triton_identity(repo, "identity_py", config("identity_py", "python"))
    write_model(repo, "identity_onnx", identity(), config("identity_onnx", "onnx"))
    large = config("large_onnx", "onnx", dim=-1)
    write_model(repo, "large_onnx", identity(dims=["batch", -1]), large)


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
class Sample:
    rate: float  # inferences/s (perf_analyzer)
    server_us: float  # server CPU (process tree) per inference, over the whole perf_analyzer run
    client_us: float  # perf_analyzer's CPU per inference, over the same run


@dataclass
class Point:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {p: [] for p in PROTOCOLS})

    def ratios(self) -> list[float]:
        return [g.rate / h.rate for g, h in zip(self.samples["grpc"], self.samples["http"], strict=True)]

    def median(self, protocol: str, what: str) -> float:
        return statistics.median(getattr(s, what) for s in self.samples[protocol])


def _inferences(server: Served, model: str) -> int:
    return _servers.inference_count(server.base_url, model)


def measure(server: Served, model: str, concurrency: int, protocol: str, workdir: Path, window_ms: int) -> Sample:
    """perf_analyzer at one point: the mean of its last 3 windows of ``window_ms``, with a stability threshold
    that always passes (this machine is shared: its noise is what the rounds are for), and the CPU that the
    server and perf_analyzer spent per inference over the whole run."""
    csv_path = workdir / f"pa_{model}_{protocol}_c{concurrency}.csv"
    cmd = [
        str(_perf.perf_analyzer_path()),
        "-m", model, "-i", protocol, "-u", server.target(protocol),
        "--concurrency-range", f"{concurrency}:{concurrency}", "--max-threads", str(concurrency),
        "--measurement-mode", "time_windows", "--measurement-interval", str(window_ms),
        "--max-trials", "5", "--stability-percentage", "1000",
        "-f", str(csv_path),
    ]  # fmt: skip
    for shape in SHAPES.get(model, ()):
        cmd += ["--shape", shape]
    output = ""
    for _ in range(3):  # a window in which nothing finished (the machine stalled) fails even this threshold
        csv_path.unlink(missing_ok=True)
        count0, server0, client0 = _inferences(server, model), server.cpu_seconds(), _perf._children_cpu_s()
        proc = subprocess.run(cmd, env=_perf.perf_analyzer_env(), capture_output=True, text=True, timeout=300)
        client_s, server_s = _perf._children_cpu_s() - client0, server.cpu_seconds() - server0
        count = _inferences(server, model) - count0
        result = _perf._parse_csv(csv_path, concurrency)
        if proc.returncode == 0 and result is not None and count > 0:
            return Sample(result.infer_per_s, 1e6 * server_s / count, 1e6 * client_s / count)
        output = proc.stdout + proc.stderr
        print(f"perf_analyzer failed ({protocol}, {model}, c={concurrency}), again: {output[-300:]!r}", flush=True)
    raise RuntimeError(f"perf_analyzer failed: {shlex.join(cmd)}\n{output[-3000:]}")


def run(
    servers: Sequence[Served],
    models: Sequence[str],
    concurrency: Sequence[int],
    rounds: int,
    workdir: Path,
    window_ms: int,
) -> dict[tuple[str, str, int], Point]:
    points: dict[tuple[str, str, int], Point] = {}
    for r in range(rounds):
        order = PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]
        for model in models:
            for c in concurrency:
                for server in servers if r % 2 == 0 else servers[::-1]:
                    point = points.setdefault((server.label, model, c), Point())
                    got = {p: measure(server, model, c, p, workdir, window_ms) for p in order}
                    for p, sample in got.items():
                        point.samples[p].append(sample)
                    g, h = got["grpc"], got["http"]
                    print(
                        f"round {r + 1} {server.label:>6} {model:<14} c={c:<3} "
                        f"grpc {g.rate:7.0f}/s {g.server_us:5.0f} us  http {h.rate:7.0f}/s {h.server_us:5.0f} us  "
                        f"ratio {g.rate / h.rate:.2f}",
                        flush=True,
                    )
    return points


def print_table(points: dict[tuple[str, str, int], Point], rounds: int) -> None:
    print(
        f"\nmedians of {rounds} interleaved rounds (perf_analyzer, binary tensors); CPU us per inference: the "
        "server's process tree and perf_analyzer, over each run\n"
    )
    print(
        "| server | model | c | gRPC infer/s | HTTP infer/s | gRPC / HTTP (rounds) | median | "
        "server us/inf gRPC / HTTP | client us/inf gRPC / HTTP |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for (label, model, c), p in points.items():
        ratios = p.ratios()
        ratio = statistics.median(ratios)
        mark = "" if ratio >= TARGET else " (below 0.8)"
        print(
            f"| {label} | {model} | {c} | {p.median('grpc', 'rate'):,.0f} | {p.median('http', 'rate'):,.0f} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {ratio:.2f}{mark} | "
            f"{p.median('grpc', 'server_us'):.0f} / {p.median('http', 'server_us'):.0f} | "
            f"{p.median('grpc', 'client_us'):.0f} / {p.median('http', 'client_us'):.0f} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(DEFAULT_MODELS), help="large_onnx: 4 MiB requests"
    )
    parser.add_argument("--window-ms", type=int, default=1500, help="perf_analyzer's measurement window")
    parser.add_argument("--before", type=Path, help="a checkout whose modelsvc is measured beside this one")
    parser.add_argument("--after", type=Path, help="a checkout to measure instead of this one")
    args = parser.parse_args(argv)
    problem = _perf.perf_analyzer_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_grpc-") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo)
        after = args.after.resolve() if args.after else None
        servers = [Served("after" if args.before else "this", repo, after)]
        if args.before:
            servers.append(Served("before", repo, args.before.resolve()))
        for s in servers:
            s.__enter__()
        try:
            points = run(servers, args.models, args.concurrency, args.rounds, Path(tmp), args.window_ms)
        finally:
            for s in servers:
                s.__exit__(None, None, None)
    print_table(points, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
