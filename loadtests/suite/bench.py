"""The benchmarks of issue 8 in one command, one table of ratios: `python -m loadtests.suite`.

Each ratio is measured within one run, the two sides in interleaved rounds (the machine is shared and noisy), and
the median of the per-round ratios is reported:

ceiling   modelsvc serving bench_core's transformer-shaped ONNX model (``tok_tuned``, batch-1 requests of 128
          tokens, best of the concurrencies tried) vs the same model in-process with onnxruntime at its best
          batch size (bench_core's ``in_process_ceiling``)
batching  the same model with ``dynamic_batching {}`` vs without, closed loop at concurrency 8
pair      doc_classifier (modelsvc + logicd, two processes) vs loadtests/naive_service.py (one process, ONNX
          Runtime per window, no batching) on long documents, documents/s at the same concurrency; both must
          give the same labels for the same documents (the correctness guard)
triton    modelsvc vs a real Triton 2.51 (nvidia-pytriton) on identity 1x16 FP32, perf_analyzer at c=8
mlserver  modelsvc vs MLServer (``.venv-mlserver``, built by tests/interop) on identity over v2 JSON at c=8
          (MLServer speaks no binary tensors and serves no model config, so perf_analyzer cannot drive it)

The peer rows (triton, mlserver) and the run, table and command line are here; the rows on modelsvc alone
(ceiling, batching) are in ``_served``, the pair rows in ``_pair``, what they share in ``_rows``.
A peer that is not installed gives a row that says so. ``--quick`` runs short windows and one round (a smoke
run, used by tests/loadtests/test_bench_suite.py); ``--only`` picks benchmarks; ``--json FILE`` saves the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np

from loadtests import bench_core
from loadtests.harness import _mlserver, _perf, _servers
from loadtests.suite._pair import bench_pair
from loadtests.suite._rows import Row, Settings, json_load, median, spread, v2_point
from loadtests.suite._served import bench_batching, bench_ceiling, write_repo

BENCHMARKS = ("ceiling", "batching", "pair", "triton", "mlserver")
PEER_CONCURRENCY = 8


# ---------------------------------------------------------------------------------------------------------
# peers on identity


IDENTITY_VALUES = np.arange(16, dtype=np.float32).reshape(1, 16)
IDENTITY_JSON = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": IDENTITY_VALUES.ravel().tolist()}]}
).encode()


def bench_triton(modelsvc: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    name = "modelsvc / Triton 2.51 (identity)"
    if _servers.pytriton_dir() is None:
        return Row(name, "-", "not installed", None, "pip install nvidia-pytriton (bash loadtests/setup.sh)")
    repo = workdir / "triton_repo"
    _servers.write_triton_identity(repo, "identity", bench_core.IDENTITY_CONFIG.format(engine='backend: "python"'))
    ours, theirs, ratios = [], [], []
    inputs = bench_core.identity_inputs()
    with _servers.triton_server(repo, workdir) as triton:
        for i in range(settings.rounds):
            print(f"  triton round {i + 1}/{settings.rounds}", flush=True)
            a = v2_point(modelsvc, "identity", PEER_CONCURRENCY, inputs, ["OUTPUT0"], workdir, settings)
            b = v2_point(triton, "identity", PEER_CONCURRENCY, inputs, ["OUTPUT0"], workdir, settings)
            ours.append(a.infer_per_s)
            theirs.append(b.infer_per_s)
            ratios.append(a.infer_per_s / b.infer_per_s)
    return Row(
        name,
        f"{median(ours):.0f} infer/s (onnxruntime)",
        f"{median(theirs):.0f} infer/s (python backend)",
        median(ratios),
        f"1x16 FP32, HTTP binary, c={PEER_CONCURRENCY}, {'perf_analyzer' if settings.load == 'perf' else 'httpx'}; "
        f"rounds {spread(ratios)}",
        ratios,
    )


MLSERVER_IDENTITY = '''"""Identity: OUTPUT0 = INPUT0, decoded and re-encoded with MLServer's NumPy codec."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class IdentityModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        tensor = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", tensor)])
'''


@contextmanager
def mlserver_identity(executable: Path, workdir: Path) -> Iterator[str]:
    """MLServer from tests/interop's environment serving ``identity`` over HTTP; yields its base URL."""

    class IdentityMLServer(_mlserver.MLServerProcess):
        def write_folder(self) -> None:
            super().write_folder()  # settings.json (ports, no workers)
            model = self.folder / "identity"
            model.mkdir(exist_ok=True)
            settings = {
                "name": "identity",
                "implementation": "model.IdentityModel",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
            }
            (model / "model-settings.json").write_text(json.dumps(settings))
            (model / "model.py").write_text(MLSERVER_IDENTITY)

    folder = workdir / "mlserver"
    folder.mkdir()
    with IdentityMLServer(executable, folder) as server:
        yield server.base


def mlserver_executable_or_none() -> Path | None:
    """``.venv-mlserver/bin/mlserver`` when tests/interop built it for the current requirements; never builds."""
    return _mlserver.executable()


def bench_mlserver(modelsvc: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    name = "modelsvc / MLServer 1.7 (identity)"
    executable = mlserver_executable_or_none()
    if executable is None:
        return Row(
            name, "-", "not installed", None,
            "run `pytest tests/interop/test_mlserver.py` once: it builds .venv-mlserver",
        )  # fmt: skip
    ours, theirs, ratios = [], [], []
    with mlserver_identity(executable, workdir) as base:
        check = httpx.post(f"{base}/v2/models/identity/infer", content=IDENTITY_JSON,
                           headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
        check.raise_for_status()
        for i in range(settings.rounds):
            print(f"  mlserver round {i + 1}/{settings.rounds}", flush=True)
            a = json_load(f"{modelsvc.base_url}/v2/models/identity/infer", [IDENTITY_JSON], PEER_CONCURRENCY,
                          settings.seconds)  # fmt: skip
            b = json_load(f"{base}/v2/models/identity/infer", [IDENTITY_JSON], PEER_CONCURRENCY, settings.seconds)
            if a.errors or b.errors:
                raise RuntimeError(f"errors under load: modelsvc {a.errors}, MLServer {b.errors}")
            ours.append(a)
            theirs.append(b)
            ratios.append(a.per_s / b.per_s)
    return Row(
        name,
        f"{median([s.per_s for s in ours]):.0f} infer/s, p50 {median([s.p50_ms for s in ours]):.2f} ms",
        f"{median([s.per_s for s in theirs]):.0f} infer/s, p50 {median([s.p50_ms for s in theirs]):.2f} ms",
        median(ratios),
        f"1x16 FP32, v2 JSON, c={PEER_CONCURRENCY}, httpx (client-bound); rounds {spread(ratios)}",
        ratios,
    )

# ---------------------------------------------------------------------------------------------------------
# the run and its table


def run(only: Sequence[str], settings: Settings) -> list[Row]:
    rows: list[Row] = []

    def attempt(name: str, fn: Callable[[], Row | list[Row]]) -> None:
        print(f"{name} ...", flush=True)
        try:
            got = fn()
            rows.extend(got if isinstance(got, list) else [got])
        except Exception as exc:
            traceback.print_exc()
            rows.append(Row(name, "-", "-", None, f"FAILED: {str(exc).strip().splitlines()[0][:200]}"))

    needs_modelsvc = [b for b in only if b in ("ceiling", "batching", "triton", "mlserver")]
    if needs_modelsvc:
        with tempfile.TemporaryDirectory(prefix="bench_suite-") as tmp:
            workdir = Path(tmp)
            write_repo(workdir / "repo")
            with _servers.modelsvc_server(workdir / "repo") as server:
                steps: dict[str, Callable[[], Row]] = {
                    "ceiling": lambda: bench_ceiling(server, workdir, settings),
                    "batching": lambda: bench_batching(server, workdir, settings),
                    "triton": lambda: bench_triton(server, workdir, settings),
                    "mlserver": lambda: bench_mlserver(server, workdir, settings),
                }
                for name in needs_modelsvc:
                    attempt(name, steps[name])
    if "pair" in only:
        attempt("pair", lambda: bench_pair(settings))
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    return sorted(rows, key=lambda r: order.get(_key(r.benchmark), len(order)))


def _key(benchmark: str) -> str:
    lowered = benchmark.lower()
    for key, word in (("ceiling", "ceiling"), ("batching", "batching"), ("pair", "pair"), ("triton", "triton"),
                      ("mlserver", "mlserver")):  # fmt: skip
        if word in lowered:
            return key
    return lowered


def format_table(rows: Sequence[Row]) -> str:
    head = ("benchmark", "modelsvc side", "other side", "ratio", "command/notes")
    cells = [(r.benchmark, r.modelsvc, r.other, "-" if r.ratio is None else f"{r.ratio:.2f}", r.notes) for r in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:", "---"]) + "|"]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round, short windows")
    parser.add_argument(
        "--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per benchmark (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, help="Python-load window in seconds (default 10, quick 3)")
    parser.add_argument("--python-load", action="store_true", help="v2 rows with asyncio+httpx, not perf_analyzer")
    parser.add_argument("--json", type=Path, help="also write the table (and per-round ratios) to this file")
    args = parser.parse_args(argv)
    only = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; choose from {', '.join(BENCHMARKS)}")
    load = "python" if args.python_load or args.quick else "perf"
    settings = Settings.quick(load) if args.quick else Settings(load=load)
    if args.rounds:
        settings = Settings(**{**asdict(settings), "rounds": args.rounds})
    if args.seconds:
        settings = Settings(**{**asdict(settings), "seconds": args.seconds})

    command = shlex.join(["python", "-m", "loadtests.suite", *(sys.argv[1:] if argv is None else argv)])
    print(bench_core.machine_line())
    print(f"command: {command}")
    if load == "perf" and (problem := _perf.perf_analyzer_problem()):
        print(f"perf_analyzer unavailable ({problem}): v2 rows use the Python load generator")
    print(flush=True)
    started = time.monotonic()
    rows = run(only, settings)
    table = format_table(rows)
    print()
    print(table)
    print(f"\n{len(rows)} rows in {time.monotonic() - started:.0f} s")
    if args.json:
        payload = {
            "machine": bench_core.machine_line(),
            "command": command,
            "date": time.strftime("%Y-%m-%d"),
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    failed = [r for r in rows if r.notes.startswith("FAILED")]
    return 1 if failed else 0
