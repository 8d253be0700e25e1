"""The data plane against Triton over a grid (issue 16): `python -m loadtests.grid` from the repository root.

One modelsvc and one real Triton 2.51 (nvidia-pytriton) up at once, each with a repository holding one identity
model (FP32 [16], ``dynamic_batching { max_queue_delay_microseconds: D }``, one KIND_CPU instance) per
(max_batch_size, delay): the Triton python-backend model.py on both servers, and on modelsvc also an ONNX Runtime
identity. Every cell (max_batch_size x delay x concurrency x protocol) measures modelsvc-python, modelsvc-onnx and
Triton back to back with perf_analyzer (binary tensors); rounds repeat the whole interleaving and the tables give
medians. Then a large-tensor row (FP32 [1, 1048576], 4 MiB a request) in MB/s, and throughput and p99 against
concurrency on one configuration, as a table and a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtests.bench_core import machine_line
from loadtests.grid import _report as report
from loadtests.grid._measure import Measurer, Point, Settings, warm_up
from loadtests.grid._models import LARGE_BYTES, LARGE_DIM, VARIANTS, Config, write_repositories
from loadtests.grid._plot import plot_curve
from loadtests.grid._report import Cell
from loadtests.harness import _perf, _servers

PARTS = ("grid", "large", "curve")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results"
STEM = "bench_grid"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None


def _names(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)} (got {text!r})")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.grid", description=__doc__.splitlines()[0])
    p.add_argument("--mbs", type=_ints, help="max_batch_size values (default 8,64)")
    p.add_argument("--delays", type=_ints, help="max_queue_delay_microseconds values (default 0,100,1000)")
    p.add_argument("--concurrency", type=_ints, help="grid concurrencies (default 1,8,32)")
    p.add_argument(
        "--models",
        type=_names(("python", "onnx")),
        default=["python", "onnx"],
        help="modelsvc's models: python,onnx (Triton always serves the python one)",
    )
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole interleaving; tables give medians")
    p.add_argument("--protocol", choices=("http", "grpc", "both"), default="http")
    p.add_argument("--parts", type=_names(PARTS), help="grid,large,curve (default all; --quick: grid,curve)")
    p.add_argument("--curve-mbs", type=int, default=64, help="the curve's max_batch_size (default 64)")
    p.add_argument("--curve-delay", type=int, default=100, help="the curve's queue delay in us (default 100)")
    p.add_argument("--curve-concurrency", type=_ints, help="default 1,2,4,8,16,32,64")
    p.add_argument("--large-concurrency", type=_ints, help="the large-tensor row's concurrencies (default 1,8)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for {STEM}.md/.json/_curve.png")
    p.add_argument(
        "--quick", action="store_true", help="one cell and a two-point curve, 1 round, short windows (for a test)"
    )
    p.add_argument("--python-load", action="store_true", help="use loadtests.loadgen, not perf_analyzer")
    p.add_argument("--window-ms", type=int, help="perf_analyzer's measurement window (default 1000, quick 300)")
    return p


def _defaults(args: argparse.Namespace) -> None:
    q = args.quick
    args.mbs = args.mbs or ([64] if q else [8, 64])
    args.delays = args.delays if args.delays is not None else ([100] if q else [0, 100, 1000])
    args.concurrency = args.concurrency or ([8] if q else [1, 8, 32])
    args.curve_concurrency = args.curve_concurrency or ([1, 8] if q else [1, 2, 4, 8, 16, 32, 64])
    args.large_concurrency = args.large_concurrency or ([1] if q else [1, 8])
    args.parts = args.parts or (["grid", "curve"] if q else list(PARTS))


def start_servers(
    stack: contextlib.ExitStack, ms_repo: Path, tr_repo: Path | None, work: Path
) -> tuple[_servers.ServerProcess, _servers.ServerProcess | None, str]:
    """modelsvc and (when ``tr_repo``) Triton, started side by side; (modelsvc, triton or None, why Triton is not
    up). Both stop when ``stack`` closes; modelsvc failing to start is an error."""
    servers = [_servers.modelsvc_server(ms_repo, ready_timeout_s=120)]
    if tr_repo is not None:
        servers.append(_servers.triton_server(tr_repo, work))
    for server in servers:
        server.start()
        stack.push(server)  # stopped (and its log removed) when the stack closes
    modelsvc = servers[0].wait_ready()
    if len(servers) == 1:
        return modelsvc, None, ""
    try:
        return modelsvc, servers[1].wait_ready(), ""
    except RuntimeError as exc:
        return modelsvc, None, str(exc).splitlines()[0]


def plan(args: argparse.Namespace) -> list[Cell]:
    """The cells in measuring order: the grid, the large-tensor row, then the curve's points not in the grid."""
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    cells: dict[tuple[Config, int, str], Cell] = {}

    def add(cfg: Config, conc: int, proto: str, part: str) -> None:
        cells.setdefault((cfg, conc, proto), Cell(cfg, conc, proto)).parts.add(part)

    for mbs in args.mbs if "grid" in args.parts else []:
        for delay in args.delays:
            for conc in args.concurrency:
                for proto in protocols:
                    add(Config(mbs, delay), conc, proto, "grid")
    for conc in args.large_concurrency if "large" in args.parts else []:
        for proto in protocols:
            add(Config(8, 0, LARGE_DIM), conc, proto, "large")
    for conc in args.curve_concurrency if "curve" in args.parts else []:
        for proto in protocols:
            add(Config(args.curve_mbs, args.curve_delay), conc, proto, "curve")
    return list(cells.values())


def _progress(label: str, cell: Cell, v: str, point: Point) -> None:
    if point.error:
        first = point.error.strip().splitlines()[0]
        print(f"  {label} {cell.label()} {cell.protocol} {v}: FAILED {first}", flush=True)
        return
    print(
        f"  {label} {cell.label()} {cell.protocol} {v:<15} {point.infer_per_s:>9,.0f}/s  p99 {point.p99_ms:6.2f} ms"
        f"  batch {report._num(point.avg_batch, '.1f'):>4}  queue {report._num(point.queue_us):>5} us"
        + (f"  ({point.note})" if point.note else ""),
        flush=True,
    )


def run_cells(
    args: argparse.Namespace,
    cells: list[Cell],
    variants: list[str],
    measurer: Measurer,
    modelsvc: _servers.ServerProcess,
    triton: _servers.ServerProcess | None,
) -> None:
    kinds = {label: (server, kind) for label, server, kind in VARIANTS}
    total = len(cells) * len(variants)
    for cfg in dict.fromkeys(c.config for c in cells):
        for v in variants:
            server_name, kind = kinds[v]
            server = modelsvc if server_name == "modelsvc" else triton
            assert server is not None
            if error := warm_up(server, cfg.model(kind), cfg.dim):
                print(f"  warm-up of {v} {cfg.model(kind)} failed: {error}", flush=True)
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]  # who goes first changes per round
        n = 0
        for cell in cells:
            for v in order:
                n += 1
                server_name, kind = kinds[v]
                server = modelsvc if server_name == "modelsvc" else triton
                assert server is not None
                point = measurer.measure(
                    server, v, cell.config.model(kind), cell.protocol, cell.concurrency, "large" in cell.parts
                )
                cell.add(point)
                _progress(f"[round {r + 1}/{args.rounds} {n}/{total}]", cell, v, point)


def render(cells: list[Cell], variants: list[str], head: list[str], triton_missing: str, png: str | None) -> str:
    grid = [c for c in cells if "grid" in c.parts]
    large = [c for c in cells if "large" in c.parts]
    curve = sorted((c for c in cells if "curve" in c.parts), key=lambda c: (c.protocol, c.concurrency))
    out = ["# Data plane grid (issue 16)", "", "```", *head, "```", ""]
    if grid:
        out += [
            "## Grid: modelsvc vs Triton, identity FP32 [1,16]",
            "",
            report.grid_table(grid, variants, triton_missing),
            "",
            *(f"- {line}" for line in report.grid_summary(grid, variants)),
            "",
        ]
        if {c.protocol for c in grid} == {"http", "grpc"}:
            table, summary = report.grpc_http_table(grid, variants)
            out += ["## modelsvc gRPC / HTTP (goal >= 0.8)", "", table, "", *(f"- {s}" for s in summary), ""]
    if large:
        out += [
            f"## Large tensors: FP32 [1, {LARGE_DIM}] ({LARGE_BYTES:,} bytes a request, binary), "
            "max_batch_size 8, delay 0",
            "",
            report.large_table(large, variants, triton_missing),
            "",
            "request MB/s = infer/s x 4,194,304 bytes / 1e6. loopback MB per infer: bytes on `lo` during the "
            "point over the server's inference count (request + response: about 8.4 expected).",
            "",
        ]
    if curve:
        cfg = curve[0].config
        out += [
            f"## Throughput and p99 against concurrency: max_batch_size {cfg.mbs}, delay {cfg.delay_us} us",
            "",
            report.curve_table(curve, variants),
            "",
        ]
        if png:
            out += [f"![throughput and p99 against concurrency]({png})", ""]
    errors = report.error_lines(cells)
    if errors:
        out += ["## Errors", "", *(f"- {e}" for e in errors), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _defaults(args)
    started = time.perf_counter()
    command = shlex.join(["python", "-m", "loadtests.grid", *(sys.argv[1:] if argv is None else argv)])
    problem = None if args.python_load else _perf.perf_analyzer_problem()
    use_perf = problem is None and not args.python_load
    settings = Settings.quick() if args.quick else Settings()
    if args.window_ms:
        settings = dataclasses.replace(settings, window_ms=args.window_ms)
    if use_perf:
        tool = (
            f"load generator: perf_analyzer ({_perf.perf_analyzer_path()}), binary tensors, "
            f"{settings.window_ms} ms windows, at most {settings.max_trials} trials at -s {settings.stability_pct}"
        )
        if settings.retry_stability_pct != settings.stability_pct:
            tool += f" (then -s {settings.retry_stability_pct}, noted)"
    else:
        why = "--python-load" if args.python_load else problem
        tool = f"load generator: FALLBACK loadtests.loadgen (Python, asyncio), because: {why}"
    triton_missing = "" if _servers.pytriton_dir() is not None else "not installed"
    head = [
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        machine_line(),
        f"command: {command}",
        tool,
    ]
    for line in head:
        print(line, flush=True)
    if triton_missing:
        print("triton: not installed (pip install nvidia-pytriton): its columns are skipped")
    cells = plan(args)
    configs = [c.config for c in cells]
    with tempfile.TemporaryDirectory(prefix="bench_grid-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        ms_repo, tr_repo = work / "modelsvc_repo", work / "triton_repo"
        write_repositories(ms_repo, None if triton_missing else tr_repo, configs, args.models)
        modelsvc, triton, why = start_servers(stack, ms_repo, None if triton_missing else tr_repo, work)
        if why:
            triton_missing = "failed to start"
            print(f"triton: failed to start, its columns are skipped: {why}")
        variants = [f"modelsvc-{k}" for k in args.models] + ([] if triton is None else ["triton-python"])
        print(f"{len(cells)} cells x {len(variants)} ({', '.join(variants)}) x {args.rounds} round(s)", flush=True)
        run_cells(args, cells, variants, Measurer(work, use_perf, settings), modelsvc, triton)
    shown = [*variants, *(["triton-python"] if triton is None else [])]
    head.append(
        f"triton: {triton_missing or 'Triton 2.51 (nvidia-pytriton), python backend'}; "
        f"rounds: {args.rounds}; took {time.perf_counter() - started:.0f} s"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    png_path = args.out / f"{STEM}_curve.png"
    curve = [c for c in cells if "curve" in c.parts]
    cfg = curve[0].config if curve else None
    subtitle = (
        ""
        if cfg is None
        else (
            f"identity FP32 [1,{cfg.dim}], max_batch_size {cfg.mbs}, max_queue_delay "
            f"{cfg.delay_us} us, {'perf_analyzer' if use_perf else 'loadgen'} "
            f"{' and '.join(dict.fromkeys(c.protocol.upper() for c in curve))}, binary tensors"
        )
    )
    drawn = plot_curve(curve, variants, png_path, command, subtitle)
    text = render(cells, shown, head, triton_missing, png_path.name if drawn else None)
    print("\n" + text)
    (args.out / f"{STEM}.md").write_text(text + "\n")
    grid = [c for c in cells if "grid" in c.parts]
    summary = report.grid_summary(grid, variants) if grid else []
    doc = {
        "command": command,
        "head": head,
        "variants": variants,
        "triton": triton_missing or "2.51",
        "summary": summary,
        "cells": [c.as_dict() for c in cells],
    }
    (args.out / f"{STEM}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out / (STEM + '.md')}, {STEM}.json" + (f", {png_path.name}" if drawn else ""))
    return 1 if report.error_lines(cells) else 0
