"""``modelsvc serve --workers N`` on a GPU machine: one-row requests from perf_analyzer (the C++ client) against
the fp16 encoder on the GPU and identity, beside a real Triton 2.51 and the encoder's 64-row figure (issue 28).

    python -m loadtests.gpu.bench_ingest [--json FILE] [--budget-s 540] [--kinds encoder,identity]
        [--workers 0,1,4,8,15] [--concurrency 1,4,16,64,128,256] [--encoder gpu_fp16] [--no-triton]

What runs, all on this machine, servers on 127.0.0.1:

- one ``modelsvc serve --workers N`` per ``--workers`` value (0 is today's single process), all started at once,
  each serving ``encoder`` (bench_torch's BERT/MiniLM-shaped TorchScript encoder, 6 layers, hidden 384, random
  weights; ``gpu_fp16``: KIND_GPU fp16; ``cpu``: KIND_CPU fp32, for machines without a GPU) and ``identity``
  (ONNX, FP32 [1,16], max_batch_size 64, dynamic batching); each measured in turn, then stopped;
- a real Triton 2.51 (nvidia-pytriton's tritonserver) serving the same identity with its python backend;
- perf_analyzer over HTTP with binary tensors at each ``--concurrency``, one row per request (``--tokens`` tokens
  for the encoder); and the encoder with 64-row requests (``-b 64``) at ``--ref-concurrency`` on the first server:
  the sequences/s the GPU reaches when the protocol work is not the limit.

Each cell is 3 measurement windows of perf_analyzer (``--measurement-interval``; ``--stability-percentage
10000``, so that it always reports). The windows' length and the concurrencies are chosen once the servers are ready
so that the rest fits ``--budget-s``: the longest window that lets the whole grid fit, else the shortest one with
concurrencies dropped (the largest, the smallest and a spread of the rest are kept; ``--window-ms`` fixes the
window); a cell the budget no longer covers says so. A cell that fails shows its error; the others still run. Then
the table (sequences/s and p99 per cell, the best per row; each cell's server and client CPU are in the JSON) and
the three ratios of the issue, each against its target:

- encoder: the best one-row sequences/s over every workers count / the 64-row sequences/s (target >= 0.80);
- identity: the best over concurrencies at 8 workers / Triton's python backend (target >= 2), and / modelsvc's one
  process, ``--workers 0`` (target >= 4).

``--json FILE`` writes every cell (and the plan, the machine, the ratios). Exit status: 0 every cell measured;
1 a cell failed or was skipped; 2 perf_analyzer cannot run here. Tested (arguments, plan, table, one tiny real run)
in tests/loadtests/test_gpu_bench_ingest.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.gpu._ingest_plan import (
    CONCURRENCY,
    KINDS,
    REF_CONCURRENCY,
    REF_ROWS,
    TRIALS,
    TRITON,
    WINDOWS_MS,
    WORKERS,
    Cell,
    Plan,
    cell_seconds,
    cell_text,
    format_table,
    plan_grid,
    ratios,
)
from loadtests.harness import _perf, _servers

IDENTITY_CONFIG = """name: "identity"
{engine}
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


# --- measuring -------------------------------------------------------------------------------------------------


def find_perf_analyzer() -> Path | None:
    """perf_analyzer beside this interpreter or on PATH, else in a ``bin`` folder beside an entry of sys.path (the
    tritonclient wheel installed with ``pip --target``, as loadtests/gpu/device_check.sh does)."""
    found = _perf.perf_analyzer_path()
    if found is not None:
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "perf_analyzer"
        if candidate.is_file():
            return candidate
    return None


def perf_env() -> dict[str, str]:
    """perf_analyzer_env(), and libcudart.so.12 from any sys.path entry (pip --target) when site-packages lacks it."""
    env = _perf.perf_analyzer_env()
    if _perf.cuda_runtime_lib_dir() is None:
        for entry in sys.path:
            lib = Path(entry or ".") / "nvidia" / "cuda_runtime" / "lib"
            if any(lib.glob("libcudart.so*")):
                env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p)
                break
    return env


def perf_problem(exe: Path | None) -> str | None:
    if exe is None:
        return "perf_analyzer not found (it ships in the tritonclient 2.51 wheel)"
    try:
        done = subprocess.run([str(exe), "--version"], env=perf_env(), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf_analyzer cannot run: {exc}"
    out = (done.stdout + done.stderr).strip()
    if "error while loading shared libraries" in out or done.returncode not in (0, 1):
        return f"perf_analyzer cannot run: {out.splitlines()[0] if out else f'exit {done.returncode}'}"
    return None


def measure(exe: Path, cell: Cell, server: _servers.ServerProcess, workdir: Path, window_ms: int,
            deadline: float, data: Path | None) -> None:  # fmt: skip
    """Fill ``cell`` from one perf_analyzer run (or its error); never past ``deadline``."""
    left = deadline - time.monotonic()
    if left < cell_seconds(window_ms):
        cell.error = f"skipped: the budget has {max(left, 0):.0f} s left, a cell needs {cell_seconds(window_ms):.0f}"
        return
    csv_path = workdir / f"pa_{cell.server}{cell.workers}_{cell.kind}_b{cell.rows}_c{cell.concurrency}.csv"
    csv_path.unlink(missing_ok=True)
    c = cell.concurrency
    cmd = [str(exe), "-m", cell.kind, "-i", "http", "-u", server.url, "-b", str(cell.rows),
           "--concurrency-range", f"{c}:{c}", "--max-threads", str(c), "--measurement-mode", "time_windows",
           "--measurement-interval", str(window_ms), "--max-trials", str(TRIALS), "--stability-percentage", "10000",
           "-f", str(csv_path)]  # fmt: skip
    if data is not None:
        cmd += ["--input-data", str(data)]
    cpu0, t0 = server.cpu_seconds(), time.monotonic()
    client0 = os.times()
    try:
        timeout = min(left, TRIALS * window_ms / 1000.0 * 3 + 30)
        done = subprocess.run(cmd, env=perf_env(), capture_output=True, text=True, timeout=timeout)
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, rc = f"perf_analyzer ran past {exc.timeout:.0f} s", -1
    wall = time.monotonic() - t0
    cell.seconds = round(wall, 2)
    client1 = os.times()
    cell.client_cpu_pct = round(100.0 * (client1.children_user + client1.children_system
                                         - client0.children_user - client0.children_system) / wall, 1)  # fmt: skip
    with contextlib.suppress(AssertionError, OSError):
        cell.server_cpu_pct = round(100.0 * (server.cpu_seconds() - cpu0) / wall, 1)
    result = _perf._parse_csv(csv_path, c) or _perf._parse_stdout(output, c)
    if rc == 0 and result is not None:
        cell.seq_per_s, cell.p50_ms, cell.p99_ms = result.infer_per_s, result.p50_ms, result.p99_ms
        return
    lines = [ln for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "fail" in ln.lower()]
    cell.error = f"perf_analyzer exit {rc}: " + " | ".join((errors or lines[-3:] or ["no output"])[:3])
    if server.proc is not None and server.proc.poll() is not None:
        cell.error += f"; the server exited ({server.proc.returncode}): {server.log_tail(600)}"


def write_repository(repo: Path, kinds: Sequence[str], encoder: str, layers: int, hidden: int) -> None:
    if "encoder" in kinds:
        from loadtests.gpu import bench_torch

        bench_torch.write_repository(repo, [encoder], layers, hidden)
        (repo / encoder).rename(repo / "encoder")
        config = repo / "encoder" / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{encoder}"', 'name: "encoder"'))
    if "identity" in kinds:
        from modelsvc.tools.onnx_models import identity, write_model

        write_model(repo, "identity", identity(), IDENTITY_CONFIG.format(engine='platform: "onnxruntime_onnx"'))


def encoder_data(workdir: Path, tokens: int) -> Path:
    """perf_analyzer's input JSON: one row of token ids (1000..29999) and a mask of ones (``-b`` repeats it)."""
    import numpy as np

    ids = np.random.default_rng(0).integers(1000, 30000, size=(1, tokens)).astype(np.int64)
    rows = [_perf.Input("input_ids", "INT64", ids), _perf.Input("attention_mask", "INT64", np.ones_like(ids))]
    return _perf.write_input_json(workdir / "encoder.json", rows)


def warm_up(url: str, kinds: Sequence[str], tokens: int) -> None:
    """A request of each kind (and a 64-row one for the encoder: the first runs on a GPU load its kernels)."""
    import numpy as np
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(url, network_timeout=300) as client:
        for kind in kinds:
            for rows in (1, REF_ROWS) if kind == "encoder" else (1,):
                feeds = {"input_ids": np.full((rows, tokens), 1000), "attention_mask": np.ones((rows, tokens))}
                feeds = {k: v.astype(np.int64) for k, v in feeds.items()}
                if kind == "identity":
                    feeds = {"INPUT0": np.ones((rows, 16), np.float32)}
                inputs = []
                datatype = "FP32" if kind == "identity" else "INT64"
                for name, array in feeds.items():
                    inputs.append(httpclient.InferInput(name, list(array.shape), datatype))
                    inputs[-1].set_data_from_numpy(array, binary_data=True)
                client.infer(kind, inputs)


def gpu_line(encoder: str) -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader",
                               "-i", "0"], capture_output=True, text=True, timeout=30)  # fmt: skip
        if done.returncode == 0 and done.stdout.strip():
            return f"GPU: {done.stdout.strip().splitlines()[0]}"
    except (OSError, subprocess.TimeoutExpired):
        pass
    if encoder.startswith("gpu"):
        try:
            import torch

            if torch.cuda.is_available():
                return f"GPU: {torch.cuda.get_device_name(0)} (torch {torch.__version__})"
            return f"GPU: none that torch {torch.__version__} sees"
        except ImportError:
            return "GPU: unknown (no nvidia-smi, no torch)"
    return "GPU: none (no nvidia-smi)"


def _ints(text: str, least: int) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers A,B,..., got {text!r}") from None
    if not values or values[0] < least:
        raise argparse.ArgumentTypeError(f"expected integers >= {least}, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from loadtests.gpu import bench_torch

    about = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m loadtests.gpu.bench_ingest", description=about)
    p.add_argument("--kinds", default=",".join(KINDS), help="encoder, identity (default both)")
    p.add_argument("--workers", type=lambda t: _ints(t, 0), default=list(WORKERS), metavar="N,...",
                   help="one server per value; 0: one process (default 0,1,4,8,15)")  # fmt: skip
    p.add_argument("--concurrency", type=lambda t: _ints(t, 1), default=list(CONCURRENCY), metavar="C,...")
    p.add_argument("--ref-concurrency", type=lambda t: _ints(t, 1), default=list(REF_CONCURRENCY), metavar="C,...",
                   help="the encoder's 64-row requests (default 4,16)")  # fmt: skip
    p.add_argument("--encoder", default="gpu_fp16", choices=sorted(bench_torch.KINDS),
                   help="bench_torch's model: gpu_fp16 (KIND_GPU fp16), gpu (fp32), cpu (KIND_CPU fp32)")  # fmt: skip
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--no-triton", action="store_true", help="no Triton 2.51 beside modelsvc")
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole run, server starts included (540)")
    p.add_argument("--window-ms", type=int, default=None, help="perf_analyzer's window (default: the plan's)")
    p.add_argument("--ready-timeout-s", type=float, default=180.0)
    p.add_argument("--json", type=Path, default=None, help="write every cell, the plan and the ratios here")
    p.add_argument("--output", type=Path, default=None, help="also write the table (with its header) here")
    p.add_argument("--workdir", type=Path, default=None, help="repositories, CSVs, server logs (default: temp)")
    args = p.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or any(k not in KINDS for k in args.kinds):
        p.error(f"--kinds: choose from {', '.join(KINDS)}, got {args.kinds}")
    if args.hidden <= 0 or args.hidden % 64 or args.layers <= 0 or args.tokens <= 0:
        p.error("--hidden must be a positive multiple of 64 (heads of 64); --layers and --tokens positive")
    if args.budget_s <= 0 or (args.window_ms is not None and args.window_ms < 100):
        p.error("--budget-s must be positive, --window-ms 100 or more")
    return args


def start_servers(args: argparse.Namespace, repo: Path, workdir: Path, triton_repo: Path | None,
                  stack: Any) -> tuple[dict[str, _servers.ServerProcess], dict[str, str]]:  # fmt: skip
    """Every server started at once, then waited for: (name -> ready server, name -> why it is not)."""
    servers: dict[str, _servers.ServerProcess] = {}
    failed: dict[str, str] = {}
    for w in args.workers:
        extra = ["--workers", str(w)]
        server = _servers.modelsvc_server(repo, args.ready_timeout_s, as_module=True, extra_args=extra,
                                          log=workdir / f"modelsvc-workers{w}.log")  # fmt: skip
        servers[f"modelsvc{w}"] = server
    if triton_repo is not None:
        try:
            servers[TRITON] = _servers.triton_server(triton_repo, workdir)
            servers[TRITON].ready_timeout_s = args.ready_timeout_s
        except Exception as exc:  # no stub for this Python, no pytriton: its cells say so
            failed[TRITON] = f"{type(exc).__name__}: {exc}"
    for name, server in list(servers.items()):
        try:
            server.start()
            stack.callback(server.close)
        except OSError as exc:
            failed[name] = f"could not start: {exc}"
            del servers[name]
    for name, server in list(servers.items()):
        try:
            server.wait_ready()
        except RuntimeError as exc:
            failed[name] = str(exc)
            del servers[name]
    return servers, failed


def main(argv: Sequence[str] | None = None) -> int:
    from contextlib import ExitStack

    from loadtests.bench_core import machine_line

    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    exe = find_perf_analyzer()
    problem = perf_problem(exe)
    if problem is not None or exe is None:
        print(f"bench_ingest: perf_analyzer is needed: {problem}", file=sys.stderr)
        return 2
    header = [machine_line(), gpu_line(args.encoder)]
    print("\n".join(header), flush=True)
    kinds = list(args.kinds)
    no_encoder = ""
    if "encoder" in kinds and args.encoder.startswith("gpu"):
        import torch

        if not torch.cuda.is_available():
            no_encoder = f"torch {torch.__version__} sees no CUDA device (--encoder cpu runs it on the CPU)"
            kinds.remove("encoder")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    repo = workdir / "modelsvc_repo"
    if kinds:
        write_repository(repo, kinds, args.encoder, args.layers, args.hidden)
    triton_repo = None
    triton_missing = ""
    if "identity" in kinds and not args.no_triton:
        if _servers.pytriton_dir() is None:
            triton_missing = "nvidia-pytriton is not installed (its tritonserver is Triton 2.51)"
        else:
            triton_repo = workdir / "triton_repo"
            _servers.write_triton_identity(triton_repo, "identity", IDENTITY_CONFIG.format(engine='backend: "python"'))
    data = encoder_data(workdir, args.tokens) if "encoder" in kinds else None
    cells: list[Cell] = []
    plan = Plan(WINDOWS_MS[-1], list(args.concurrency), 0.0)
    with ExitStack() as stack:
        servers, failed = start_servers(args, repo, workdir, triton_repo, stack) if kinds else ({}, {})
        for name, server in list(servers.items()):
            try:
                warm_up(server.url, ["identity"] if name == TRITON else kinds, args.tokens)
            except Exception as exc:  # a model that does not answer: that server's cells carry it
                failed[name] = f"warm-up failed: {type(exc).__name__}: {str(exc)[:400]}"
        print(f"bench_ingest: servers ready after {time.monotonic() - started:.0f} s: {sorted(servers)}"
              + (f"; not: {failed}" if failed else ""), flush=True)  # fmt: skip
        order = [(f"modelsvc{w}", w, kinds) for w in args.workers]
        if triton_repo is not None:
            order.append((TRITON, None, ["identity"]))
        live = [(n, k) for n, _, ks in order for k in ks if n in servers and n not in failed]
        ref = next((n for n, k in live if k == "encoder"), None)
        # what is left, less each server's stop (SIGTERM drains its workers) and the table
        left = deadline - time.monotonic() - 3.0 * len(servers) - 5.0
        windows = [args.window_ms] if args.window_ms else WINDOWS_MS
        plan = plan_grid(left, len(live), args.concurrency, len(args.ref_concurrency) if ref else 0, windows)
        print(f"bench_ingest: plan: windows of {plan.window_ms} ms x {TRIALS}, concurrency {plan.concurrencies}"
              + (f" (dropped for the budget: {plan.dropped})" if plan.dropped else "")
              + f", about {plan.estimate_s:.0f} s of {max(left, 0):.0f} s left", flush=True)  # fmt: skip
        for name, w, server_kinds in order:
            for kind in server_kinds:
                points = [(c, 1) for c in plan.concurrencies]
                points += [(c, REF_ROWS) for c in args.ref_concurrency] if (name, kind) == (ref, "encoder") else []
                for c, rows in points:
                    cell = Cell(TRITON if name == TRITON else "modelsvc", kind, w, c, rows)
                    cells.append(cell)
                    if name not in servers or name in failed:
                        cell.error = failed.get(name, "not started")
                        continue
                    measure(exe, cell, servers[name], workdir, plan.window_ms, deadline,
                            data if kind == "encoder" else None)  # fmt: skip
                    cpu = f"server CPU {cell.server_cpu_pct}%, client {cell.client_cpu_pct}%"
                    print(f"bench_ingest: {kind} {cell.label} c={c} rows={rows}: {cell_text(cell)} ({cpu})", flush=True)
            if name in servers:
                servers.pop(name).close()  # stopped before the next server is measured
    for kind, why in (("encoder", no_encoder), ("identity", triton_missing)):
        if why:
            who = TRITON if kind == "identity" else "modelsvc"
            for w in [None] if who == TRITON else args.workers:
                cells += [Cell(who, kind, w, c, error=why) for c in plan.concurrencies]
    header += [
        f"perf_analyzer over HTTP, binary tensors; seq/s (p99 ms) per concurrency; windows of {plan.window_ms} ms "
        f"x {TRIALS}; encoder: bench_torch's {args.encoder}, {args.layers} layers, hidden {args.hidden}, "
        f"{args.tokens} tokens; identity FP32 [1,16], max_batch_size 64, dynamic batching"
        + (f"; concurrencies dropped for the budget: {plan.dropped}" if plan.dropped else "")
    ]
    text = format_table(cells, plan.concurrencies, header)
    print("\n" + text, flush=True)
    if args.output is not None:
        args.output.write_text(text + "\n")
    elapsed = time.monotonic() - started
    print(f"\nbench_ingest: {elapsed:.0f} s of the {args.budget_s:.0f} s budget; logs and CSVs in {workdir}")
    if args.json is not None:
        doc = {
            "script": "loadtests.gpu.bench_ingest", "header": header, "elapsed_s": round(elapsed, 1),
            "budget_s": args.budget_s, "plan": asdict(plan), "workdir": str(workdir),
            "cells": [asdict(c) for c in cells],
            "ratios": [{**asdict(r), "verdict": r.verdict} for r in ratios(cells)],
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if cells and all(c.seq_per_s is not None for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
