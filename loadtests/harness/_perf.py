"""Load generation: perf_analyzer (from the tritonclient wheel) with a Python fallback.

perf_analyzer needs libb64 (Debian libb64-0d) and libcudart (PyPI nvidia-cuda-runtime-cu12);
``perf_analyzer_env`` puts the latter's folder on LD_LIBRARY_PATH by locating it in site-packages.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Keep each measured point to a few seconds: 2 s windows, a loose stability check, few trials.
WINDOW_MS = 2000
STABILITY_PCT = 25
MAX_TRIALS = 5


@dataclass
class LoadResult:
    """One measured point."""

    concurrency: int
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    tool: str  # "perf_analyzer" or "python-httpx"
    server_cpu_pct: float | None = None  # CPU time of the server process tree / wall time
    client_cpu_pct: float | None = None  # CPU time of the load generator / wall time
    note: str = ""
    avg_batch: float | None = None  # server-reported inference count / execution count
    server_breakdown: str = ""  # perf_analyzer's "Avg request latency: ..." line from server statistics
    queue_us: float | None = None  # the server's average queue time per request, from that line


@dataclass
class Input:
    """A request input for the Python load generator (batch-1 tensor) and perf_analyzer's JSON data."""

    name: str
    datatype: str  # v2 datatype, e.g. "FP32", "INT64"
    data: np.ndarray[Any, Any]  # full shape including the batch dimension of 1
    extra: dict[str, object] = field(default_factory=dict)


def _site_dirs() -> list[Path]:
    dirs = [Path(p) for p in site.getsitepackages()]
    dirs.append(Path(site.getusersitepackages()))
    return [d for d in dirs if d.is_dir()]


def cuda_runtime_lib_dir() -> Path | None:
    """The ``nvidia/cuda_runtime/lib`` folder of the nvidia-cuda-runtime-cu12 wheel, if installed."""
    for d in _site_dirs():
        lib = d / "nvidia" / "cuda_runtime" / "lib"
        if any(lib.glob("libcudart.so*")):
            return lib
    return None


def perf_analyzer_path() -> Path | None:
    """perf_analyzer installed by the tritonclient wheel next to this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / "perf_analyzer"
    if beside.exists():
        return beside
    found = shutil.which("perf_analyzer")
    return Path(found) if found else None


def perf_analyzer_env() -> dict[str, str]:
    env = dict(os.environ)
    lib = cuda_runtime_lib_dir()
    if lib is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def perf_analyzer_problem() -> str | None:
    """None when perf_analyzer starts here; otherwise why not (first lines of its error)."""
    exe = perf_analyzer_path()
    if exe is None:
        return "perf_analyzer not found (it ships in the tritonclient 2.51 wheel)"
    try:
        proc = subprocess.run(
            [str(exe), "--version"], env=perf_analyzer_env(), capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf_analyzer cannot run: {exc}"
    out = proc.stdout + proc.stderr
    if "error while loading shared libraries" in out or proc.returncode not in (0, 1):
        return "perf_analyzer cannot run: " + out.strip().splitlines()[0] if out.strip() else "exit code"
    return None


def _children_cpu_s() -> float:
    ru = os.times()
    return ru.children_user + ru.children_system


def write_input_json(path: Path, inputs: Sequence[Input], variants: int = 1) -> Path:
    """perf_analyzer --input-data JSON: each entry is one batch-1 request (shape without the batch dim)."""
    entries = []
    rng = np.random.default_rng(0)
    for i in range(variants):
        entry: dict[str, object] = {}
        for inp in inputs:
            arr = inp.data[0]
            if i and inp.name == "input_ids":
                arr = rng.permutation(arr)
            entry[inp.name] = {"content": arr.reshape(-1).tolist(), "shape": list(arr.shape)}
        entries.append(entry)
    path.write_text(json.dumps({"data": entries}))
    return path


def run_perf_analyzer(
    model: str,
    url: str,
    concurrency: int,
    workdir: Path,
    input_data: Path | None = None,
    shapes: Sequence[str] = (),
    protocol: str = "http",
    *,
    window_ms: int = WINDOW_MS,
    max_trials: int = MAX_TRIALS,
    stability_pct: int = STABILITY_PCT,
    retry_stability_pct: int = 100,
) -> tuple[LoadResult | None, str, list[str]]:
    """Run one concurrency point with binary tensors over ``protocol`` (``http`` or ``grpc``; ``url`` is then
    host:port of that endpoint); (result or None, output, command). ``window_ms``, ``max_trials`` and
    ``stability_pct`` are perf_analyzer's ``--measurement-interval``, ``--max-trials`` and
    ``--stability-percentage`` (retried once at ``retry_stability_pct`` when not stable)."""
    exe = perf_analyzer_path()
    assert exe is not None
    tag = "" if protocol == "http" else f"_{protocol}"
    csv_path = workdir / f"pa_{model}{tag}_c{concurrency}.csv"
    base = [
        str(exe),
        "-m", model,
        "-i", protocol,
        "-u", url,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--max-threads", str(concurrency),
        "--measurement-mode", "time_windows",
        "--measurement-interval", str(window_ms),
        "--max-trials", str(max_trials),
        "-f", str(csv_path),
    ]  # fmt: skip
    if input_data is not None:
        base += ["--input-data", str(input_data)]
    for s in shapes:
        base += ["--shape", s]
    output = ""
    cmd = base
    # A second try with a stability threshold that always passes, so a noisy machine still yields a number.
    for stability in dict.fromkeys((stability_pct, retry_stability_pct)):
        cmd = [*base, "--stability-percentage", str(stability)]
        csv_path.unlink(missing_ok=True)
        cpu0, t0 = _children_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t0
        client_cpu = 100.0 * (_children_cpu_s() - cpu0) / wall
        output = proc.stdout + proc.stderr
        result = _parse_csv(csv_path, concurrency) or _parse_stdout(output, concurrency)
        if proc.returncode == 0 and result is not None:
            result.client_cpu_pct = client_cpu
            _add_server_side(result, output)
            if stability != stability_pct:
                result.note = f"unstable at -s {stability_pct}"
            return result, output, cmd
        if "stable" not in output:
            break
    return None, output, cmd


def _parse_csv(path: Path, concurrency: int) -> LoadResult | None:
    if not path.exists():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row.get("Concurrency") and int(row["Concurrency"]) == concurrency:
            return LoadResult(
                concurrency=concurrency,
                infer_per_s=float(row["Inferences/Second"]),
                p50_ms=float(row["p50 latency"]) / 1000.0,
                p99_ms=float(row["p99 latency"]) / 1000.0,
                tool="perf_analyzer",
            )
    return None


def _add_server_side(result: LoadResult, output: str) -> None:
    """Server-side figures that perf_analyzer reads from /v2/models/<m>/stats, when the server has them."""
    infer = re.search(r"Server:\s+Inference count: (\d+)\s+Execution count: (\d+)", output)
    if infer and int(infer[2]):
        result.avg_batch = int(infer[1]) / int(infer[2])
    breakdown = re.search(r"Avg request latency: (.*)", output)
    if breakdown:
        result.server_breakdown = breakdown[1].strip()
        queue = re.search(r"queue (\d+) usec", result.server_breakdown)
        if queue:
            result.queue_us = float(queue[1])


def _parse_stdout(output: str, concurrency: int) -> LoadResult | None:
    thr = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    p50 = re.search(r"p50 latency: (\d+) usec", output)
    p99 = re.search(r"p99 latency: (\d+) usec", output)
    if not (thr and p50 and p99):
        return None
    return LoadResult(concurrency, float(thr[1]), int(p50[1]) / 1000.0, int(p99[1]) / 1000.0, tool="perf_analyzer")


# ---------------------------------------------------------------------------------------------------------
# Python fallback: asyncio + httpx, v2 binary tensor extension, closed loop with N workers.


def _binary_request(inputs: Sequence[Input], outputs: Sequence[str]) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {
                "name": i.name,
                "shape": list(i.data.shape),
                "datatype": i.datatype,
                "parameters": {"binary_data_size": i.data.nbytes},
            }
            for i in inputs
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    head = json.dumps(header).encode()
    return head + b"".join(np.ascontiguousarray(i.data).tobytes() for i in inputs), len(head)


async def _python_load(
    base_url: str,
    model: str,
    inputs: Sequence[Input],
    outputs: Sequence[str],
    concurrency: int,
    seconds: float,
) -> tuple[int, list[float], int]:
    import httpx

    body, head_len = _binary_request(inputs, outputs)
    headers = {"Inference-Header-Content-Length": str(head_len), "Content-Type": "application/octet-stream"}
    url = f"{base_url}/v2/models/{model}/infer"
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        warm_end = time.perf_counter() + 1.0
        end = warm_end + seconds

        async def worker() -> None:
            nonlocal errors
            while (now := time.perf_counter()) < end:
                r = await client.post(url, content=body, headers=headers)
                done = time.perf_counter()
                if r.status_code != 200:
                    errors += 1
                elif now >= warm_end:
                    latencies.append(done - now)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), latencies, errors


def run_python_load(
    base_url: str,
    model: str,
    inputs: Sequence[Input],
    outputs: Sequence[str],
    concurrency: int,
    seconds: float = 5.0,
) -> LoadResult:
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    n, lat, errors = asyncio.run(_python_load(base_url, model, inputs, outputs, concurrency, seconds))
    client_cpu = 100.0 * (time.process_time() - cpu0) / (time.perf_counter() - t0)
    arr = np.array(lat) * 1000.0 if lat else np.array([float("nan")])
    return LoadResult(
        concurrency=concurrency,
        infer_per_s=n / seconds,
        p50_ms=float(np.percentile(arr, 50)),
        p99_ms=float(np.percentile(arr, 99)),
        tool="python-httpx",
        client_cpu_pct=client_cpu,
        note=f"{errors} errors" if errors else "",
    )
