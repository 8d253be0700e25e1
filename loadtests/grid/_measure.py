"""One measured point of the grid benchmark: perf_analyzer (binary tensors, HTTP or gRPC) with the server-side
split it reads from the model's statistics, or, where perf_analyzer cannot run, loadtests.loadgen (the project's
Python load generator, which reads the same statistics)."""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness import _perf, _servers


@dataclass
class Point:
    """One (server, model, protocol, concurrency) measurement; ``error`` set (and the figures NaN) when it failed."""

    variant: str  # modelsvc-python, modelsvc-onnx, triton-python
    model: str
    protocol: str
    concurrency: int
    infer_per_s: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    avg_batch: float | None = None
    queue_us: float | None = None
    server_cpu_pct: float | None = None
    tool: str = ""
    note: str = ""
    loopback_bytes_per_infer: float | None = None  # bytes on the loopback device per inference (both ways)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.infer_per_s > 0

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Settings:
    """How long each point runs."""

    window_ms: int = 1000
    max_trials: int = 4
    stability_pct: int = 30
    retry_stability_pct: int = 1000  # a shared machine's windows can swing 2x: then take the number, noted
    loadgen_windows: int = 3
    loadgen_warmup_s: float = 0.5

    @classmethod
    def quick(cls) -> Settings:
        return cls(window_ms=300, max_trials=4, stability_pct=1000, loadgen_windows=2, loadgen_warmup_s=0.2)


def loopback_bytes() -> int | None:
    """Bytes received on the loopback device so far (each byte sent over 127.0.0.1 is counted once)."""
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def inference_count(server: _servers.ServerProcess, model: str) -> int | None:
    """The model's cumulative inference count from GET /v2/models/<m>/stats (modelsvc and Triton alike)."""
    try:
        return _servers.inference_count(server.base_url, model)
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def warm_up(server: _servers.ServerProcess, model: str, dim: int, requests: int = 3) -> str:
    """A few batch-1 inferences (binary tensors) before the first measurement, so that no window holds a model's
    first call; "" or the last error (the measurement then reports its own)."""
    head = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, dim], "datatype": "FP32", "parameters": {"binary_data_size": 4 * dim}}
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    body = head + bytes(4 * dim)
    error = ""
    for _ in range(requests):
        try:
            r = httpx.post(f"{server.base_url}/v2/models/{model}/infer", content=body, headers=headers, timeout=60.0)
            error = "" if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
    return error


class Measurer:
    """Measures points with perf_analyzer when ``use_perf``, else with loadtests.loadgen."""

    def __init__(self, workdir: Path, use_perf: bool, settings: Settings):
        self.workdir = workdir
        self.use_perf = use_perf
        self.settings = settings

    @property
    def tool(self) -> str:
        return "perf_analyzer" if self.use_perf else "loadgen"

    def measure(
        self,
        server: _servers.ServerProcess,
        variant: str,
        model: str,
        protocol: str,
        concurrency: int,
        count_bytes: bool = False,
    ) -> Point:
        point = Point(variant, model, protocol, concurrency, tool=self.tool)
        lo0 = loopback_bytes() if count_bytes else None
        n0 = inference_count(server, model) if count_bytes else None
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        try:
            if self.use_perf:
                self._perf(point, server)
            else:
                self._loadgen(point, server)
        except Exception as exc:  # one failed point is a row that says so, the grid goes on
            point.error = f"{type(exc).__name__}: {exc}"
        point.server_cpu_pct = 100.0 * (server.cpu_seconds() - cpu0) / (time.perf_counter() - t0)
        lo1 = loopback_bytes() if count_bytes else None
        n1 = inference_count(server, model) if count_bytes else None
        if lo0 is not None and lo1 is not None and n0 is not None and n1 is not None and n1 > n0:
            point.loopback_bytes_per_infer = (lo1 - lo0) / (n1 - n0)
        return point

    def _perf(self, point: Point, server: _servers.ServerProcess) -> None:
        url = server.url if point.protocol == "http" else server.grpc_url
        s = self.settings
        # A window in which a loaded machine completed (almost) nothing fails perf_analyzer's stability check at any
        # threshold: then once more with windows twice as long.
        for window_ms in (s.window_ms, 2 * s.window_ms):
            result, output, cmd = _perf.run_perf_analyzer(
                point.model,
                url,
                point.concurrency,
                self.workdir,
                protocol=point.protocol,
                window_ms=window_ms,
                max_trials=s.max_trials,
                stability_pct=s.stability_pct,
                retry_stability_pct=s.retry_stability_pct,
            )
            if result is not None or "stable" not in output:
                break
        if result is None:
            tail = "\n".join(output.strip().splitlines()[-6:])
            raise RuntimeError(f"perf_analyzer failed: {shlex.join(cmd)}\n{tail}")
        point.infer_per_s, point.p50_ms, point.p99_ms = result.infer_per_s, result.p50_ms, result.p99_ms
        notes = [result.note] if result.note else []
        if window_ms != s.window_ms:
            notes.append(f"unstable in {s.window_ms} ms windows, measured in {window_ms} ms ones")
        point.avg_batch, point.queue_us, point.note = result.avg_batch, result.queue_us, "; ".join(notes)

    def _loadgen(self, point: Point, server: _servers.ServerProcess) -> None:
        from loadtests import loadgen

        url = f"http://{server.url}" if point.protocol == "http" else f"grpc://{server.grpc_url}"
        target = loadgen.Target(url, model=point.model, stats_url=server.base_url)
        s = self.settings
        load = loadgen.Load(
            concurrency=point.concurrency,
            warmup_s=s.loadgen_warmup_s,
            window_s=s.window_ms / 1000.0,
            windows=s.loadgen_windows,
        )
        result = loadgen.run(target, load, loadgen.InputSpec("random"))
        if result.requests == 0:
            raise RuntimeError(f"no answer; errors: {result.errors}")
        point.infer_per_s, point.p50_ms, point.p99_ms = result.infer_per_s, result.p(50), result.p(99)
        if result.server is not None:
            point.avg_batch, point.queue_us = result.server.avg_batch, result.server.queue_us
        notes = [f"{k}: {v}" for k, v in sorted(result.errors.items())] + list(result.notes)
        point.note = "; ".join(notes)
