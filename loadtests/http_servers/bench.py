"""Our hand-written HTTP server against maintained ones, on the same data plane (issue 16):

    python -m loadtests.http_servers                       # the grid, 3 interleaved rounds
    python -m loadtests.http_servers --profile             # and a py-spy profile of each server at c=8
    python -m loadtests.http_servers --servers ours,granian --concurrency 8 --rounds 3

Each server (loadtests/http_servers/_run.py: ours, uvicorn, granian, hypercorn and variants) runs in its own
process over one model repository: identity FP32 [1,16] as a python model and as an ONNX Runtime model, each with
max_batch_size 8 and 64 and a queue delay of 0, plus a 4 MiB identity (FP32 [1,1048576]). perf_analyzer (HTTP,
binary tensors) drives each cell; rounds interleave the servers (A, B, C, A, B, C...), and the table shows the
median inferences/s of each server as a ratio to ours, with the server's CPU time per request (from /proc and the
model's statistics).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadtests.grid import _models as _grid_models
from loadtests.harness import _perf, _servers
from loadtests.http_servers._profile import profile_server
from loadtests.http_servers._run import SERVERS

ENGINES = {"py": _grid_models.ENGINES["python"], "onnx": _grid_models.ENGINES["onnx"]}
MODELS = ("py_mbs8", "py_mbs64", "onnx_mbs8", "onnx_mbs64")
LARGE = "onnx_large"
LARGE_DIM = 1 << 20
LARGE_CONCURRENCY = 4
DEFAULT_SERVERS = ("ours", "uvicorn", "granian", "hypercorn")


def write_repo(repo: Path) -> None:
    from modelsvc.tools.onnx_models import identity, write_model

    for name in MODELS:
        engine, mbs = name.split("_mbs")
        config = _grid_models.CONFIG.format(name=name, engine=ENGINES[engine], mbs=mbs, dim=16, delay=0)
        if engine == "onnx":
            write_model(repo, name, identity(), config)
        else:
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "1" / "model.py").write_text(_servers.TRITON_IDENTITY_MODEL_PY)
            (repo / name / "config.pbtxt").write_text(config)
    config = _grid_models.CONFIG.format(name=LARGE, engine=ENGINES["onnx"], mbs=8, dim=LARGE_DIM, delay=0)
    write_model(repo, LARGE, identity(dims=["batch", LARGE_DIM]), config)


def runner(server: str, repo: Path) -> _servers.ServerProcess:
    port = _servers.free_port()
    argv = [sys.executable, "-m", "loadtests.http_servers._run", server, str(repo), str(port)]
    return _servers.ServerProcess(f"http-{server}", argv, port, cwd=_servers.ROOT)


def success_count(base_url: str, model: str) -> int:
    stats = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@dataclass
class Cell:
    """One server at one (model, concurrency) point, over the rounds."""

    infer_per_s: list[float] = field(default_factory=list)
    cpu_us_per_request: list[float] = field(default_factory=list)
    cpu_pct: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def measure(
    proc: _servers.ServerProcess, model: str, concurrency: int, workdir: Path, cell: Cell, window_ms: int
) -> None:
    n0, c0, t0 = success_count(proc.base_url, model), proc.cpu_seconds(), time.perf_counter()
    result, output, _ = _perf.run_perf_analyzer(model, proc.url, concurrency, workdir, window_ms=window_ms)
    n1, c1, t1 = success_count(proc.base_url, model), proc.cpu_seconds(), time.perf_counter()
    if result is None:
        cell.errors.append(output.strip().splitlines()[-1] if output.strip() else "no output")
        return
    cell.infer_per_s.append(result.infer_per_s)
    cell.p99_ms.append(result.p99_ms)
    cell.cpu_pct.append(100.0 * (c1 - c0) / (t1 - t0))
    if n1 > n0:
        cell.cpu_us_per_request.append(1e6 * (c1 - c0) / (n1 - n0))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: dict[tuple[str, int], dict[str, Cell]], servers: list[str], large: bool) -> str:
    head = (
        "| model | c | "
        + " | ".join(f"{s} inf/s" if s == servers[0] else f"{s}/{servers[0]}" for s in servers)
        + " | "
        + " | ".join(f"{s} CPU us/req" for s in servers)
        + " |"
    )
    lines = [head, "|" + "---|" * (2 + 2 * len(servers))]
    ratios: dict[str, list[float]] = {s: [] for s in servers}
    cpu_ratios: dict[str, list[float]] = {s: [] for s in servers}
    for (model, conc), cells in results.items():
        base = _median(cells[servers[0]].infer_per_s)
        row = [model, str(conc)]
        for s in servers:
            value = _median(cells[s].infer_per_s)
            if s == servers[0]:
                row.append(f"{value:.0f}" if model != LARGE else f"{value:.1f} ({value * 4:.0f} MiB/s)")
            else:
                row.append(f"{value / base:.2f}")
                if model != LARGE or large:
                    ratios[s].append(value / base)
        row += [f"{_median(cells[s].cpu_us_per_request):.0f}" for s in servers]
        base_cpu = _median(cells[servers[0]].cpu_us_per_request)
        for s in servers[1:]:
            cpu = _median(cells[s].cpu_us_per_request)
            if cpu == cpu and base_cpu == base_cpu and (model != LARGE or large):
                cpu_ratios[s].append(cpu / base_cpu)
        lines.append("| " + " | ".join(row) + " |")
    geo = ["geomean", ""]
    for s in servers:
        values = ratios[s]
        geo.append("" if s == servers[0] or not values else f"{statistics.geometric_mean(values):.2f}")
    geo.append("")
    for s in servers[1:]:
        values = cpu_ratios[s]
        geo.append(f"{statistics.geometric_mean(values):.2f}x ours" if values else "")
    lines.append("| " + " | ".join(geo) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.http_servers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--servers", default=",".join(DEFAULT_SERVERS), help=f"of {', '.join(SERVERS)}")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer's measurement interval")
    parser.add_argument("--no-large", action="store_true", help="leave out the 4 MiB tensor point")
    parser.add_argument("--profile", action="store_true", help="py-spy each server under c=8 (onnx_mbs64)")
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and the profiles")
    args = parser.parse_args()
    problem = _perf.perf_analyzer_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    servers = args.servers.split(",")
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"unknown servers {unknown}; known: {', '.join(SERVERS)}")
    points = [(m, int(c)) for m in args.models.split(",") for c in args.concurrency.split(",")]
    if not args.no_large:
        points.append((LARGE, LARGE_CONCURRENCY))
    results = {p: {s: Cell() for s in servers} for p in points}
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        work = Path(tmp)
        out = args.out or work / "out"
        out.mkdir(parents=True, exist_ok=True)
        repo = work / "repo"
        write_repo(repo)
        for r in range(args.rounds):
            for server in servers:
                t0 = time.perf_counter()
                with runner(server, repo) as proc:
                    for model, conc in points:
                        measure(proc, model, conc, work, results[(model, conc)][server], args.window_ms)
                print(f"round {r + 1}: {server} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if args.profile:
            for server in servers:
                with runner(server, repo) as proc:
                    summary = profile_server(proc, "onnx_mbs64", 8, work, out / f"pyspy-{server}")
                print(f"\n### py-spy: {server} (onnx_mbs64, c=8)\n{summary}")
        print("\ncommand: python -m loadtests.http_servers " + shlex.join(sys.argv[1:]))
        for s in servers:
            print(f"- {s}: {SERVERS[s]}")
        print()
        print(table(results, servers, large=False))
        errors = [(p, s, c.errors) for p, cells in results.items() for s, c in cells.items() if c.errors]
        for point, server, errs in errors:
            print(f"errors: {server} at {point}: {errs}", file=sys.stderr)
        dump = {f"{m} c={c} {s}": vars(cell) for (m, c), cells in results.items() for s, cell in cells.items()}
        (out / "results.json").write_text(json.dumps(dump, indent=1))
        if args.out is None:
            print("(results.json in a temporary folder, removed; pass --out to keep it)", file=sys.stderr)
    return 0
