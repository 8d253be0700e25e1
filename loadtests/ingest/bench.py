"""``modelsvc serve --workers N`` against one process: where each request's CPU goes, and the throughput.

    python -m loadtests.ingest [--workers 0,1,2] [--rounds 3] [--concurrency 8] [--seconds 3] [--models identity,minilm]

One server per ``--workers`` value (0 is today's single process) serves identity FP32 [1,16] (max_batch_size 64,
dynamic batching) and, when its ONNX Runtime build is there, the embedder's MiniLM (one 128-token window per
request, at most 8 in flight, windows of 8 s or more). The servers are measured in turns, the order rotated each
round (these machines are shared and noisy), with perf_analyzer at one concurrency over HTTP. For each point:
requests/s, and the CPU per request from /proc of the engine process (which owns the models) and of its workers, per
10,000 requests. Ratios are against the single process (``--workers 0``) of the same round; the table shows their
median over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from loadtests import ab_http
from loadtests.bench_core import machine_line
from loadtests.harness import _perf, _servers
from modelsvc.tools.onnx_models import identity, write_model

ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / "services" / "embedder" / "model_repository" / "minilm"
IDENTITY = ab_http.CONFIG
"""The identity model of the HTTP A/B benchmark (16 floats, batches of 64)."""


def _split_cpu(server: _servers.ServerProcess) -> tuple[float, float]:
    """(engine, workers) CPU seconds so far: the server's own process, and its descendants."""
    assert server.proc is not None
    engine = _servers.cpu_seconds(server.proc.pid)
    return engine, server.cpu_seconds() - engine


def _server(workers: int, repo: Path) -> _servers.ServerProcess:
    http, grpc, metrics = _servers.free_port(), _servers.free_port(), _servers.free_port()
    argv = [sys.executable, "-m", "modelsvc", "serve", "--model-repository", str(repo), "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--workers", str(workers)]  # fmt: skip
    return _servers.ServerProcess(f"workers={workers}", argv, http, grpc_port=grpc, ready_timeout_s=120)


def _inputs(model: str, workdir: Path) -> tuple[Path | None, list[str]]:
    if model == "identity":
        return None, []
    ids = np.arange(1000, 1128, dtype=np.int64).reshape(1, 128)
    columns = (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", np.zeros_like(ids)))
    data = [_perf.Input(n, "INT64", v) for n, v in columns]
    return _perf.write_input_json(workdir / "minilm.json", data), []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--models", default="identity,minilm")
    args = p.parse_args(argv)
    problem = _perf.perf_analyzer_problem()
    if problem is not None:
        print(f"perf_analyzer is needed: {problem}", file=sys.stderr)
        return 2
    counts = [int(w) for w in args.workers.split(",")]
    models = args.models.split(",")
    if "minilm" in models and not (MINILM / "1" / "model.onnx").exists():
        print("minilm skipped: no ONNX Runtime build of the embedder (python -m services.build --service embedder)")
        models.remove("minilm")
    print(machine_line())
    rows: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        repo = workdir / "repo"
        write_model(repo, "identity", identity(), IDENTITY)
        if "minilm" in models:
            (repo / "minilm").symlink_to(MINILM)
        servers = {w: stack.enter_context(_server(w, repo)) for w in counts}
        for r in range(args.rounds):
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            for model in models:
                data, shapes = _inputs(model, workdir)
                for w in order:
                    server = servers[w]
                    before = _servers.inference_count(server.base_url, model)
                    e0, w0 = _split_cpu(server)
                    # MiniLM: at most 8 windows in flight, in windows long enough for seconds-long answers; and any
                    # three windows count as stable (the CPU and the count come from the server, not from them)
                    concurrency = args.concurrency if model == "identity" else min(args.concurrency, 8)
                    window = args.seconds if model == "identity" else max(args.seconds, 8.0)
                    result, output, _ = _perf.run_perf_analyzer(
                        model, f"127.0.0.1:{server.http_port}", concurrency, workdir, data, shapes,
                        window_ms=int(window * 1000), max_trials=4, retry_stability_pct=1000,
                    )  # fmt: skip
                    e1, w1 = _split_cpu(server)
                    n = _servers.inference_count(server.base_url, model) - before
                    if result is None or n <= 0:
                        print(f"{model} workers={w}: no result\n{output[-2000:]}", file=sys.stderr)
                        continue
                    point = (result.infer_per_s, 1e6 * (e1 - e0) / n, 1e6 * (w1 - w0) / n)
                    rows.setdefault((model, w), []).append(point)
    _table(rows, models, counts, args)
    return 0


def _table(rows: dict[tuple[str, int], list[tuple[float, float, float]]], models: list[str], counts: list[int],
           args: argparse.Namespace) -> None:  # fmt: skip
    print(f"\nperf_analyzer over HTTP, concurrency {args.concurrency}, {args.rounds} rounds; CPU in us per request "
          "(per 10,000 requests: x 10,000 us), medians over the rounds")  # fmt: skip
    head = ("model", "workers", "infer/s", "engine us", "workers us", "total us", "engine / one process",
            "infer/s ratio")  # fmt: skip
    print(" | ".join(head))
    for model in models:
        base = rows.get((model, 0))
        for w in counts:
            got = rows.get((model, w))
            if not got:
                continue
            rate = statistics.median(g[0] for g in got)
            engine = statistics.median(g[1] for g in got)
            work = statistics.median(g[2] for g in got)
            share = rate_ratio = "-"
            if base and w:
                rounds = min(len(base), len(got))
                share = f"{statistics.median(got[i][1] / (base[i][1] + base[i][2]) for i in range(rounds)):.2f}"
                rate_ratio = f"{statistics.median(got[i][0] / base[i][0] for i in range(rounds)):.2f}"
            cells = (model, w, f"{rate:.0f}", f"{engine:.0f}", f"{work:.0f}", f"{engine + work:.0f}", share, rate_ratio)
            print(" | ".join(map(str, cells)))


if __name__ == "__main__":
    sys.exit(main())
