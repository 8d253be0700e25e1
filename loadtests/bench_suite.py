"""The benchmarks of issue 8 in one command, one table of ratios: `python -m loadtests.bench_suite`.

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

A peer that is not installed gives a row that says so. ``--quick`` runs short windows and one round (a smoke
run, used by tests/test_bench_suite.py); ``--only`` picks benchmarks; ``--json FILE`` saves the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests import _perf, _servers, bench_core
from loadtests._documents import long_documents
from loadtests._perf import Input, LoadResult

BENCHMARKS = ("ceiling", "batching", "pair", "triton", "mlserver")
PEER_CONCURRENCY = 8
BATCHING_CONCURRENCY = 8
TOK_DYN_CONFIG = "dynamic_batching { }\n"


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure; ``quick`` is the smoke-run preset."""

    rounds: int = 3
    seconds: float = 10.0
    """Length of one Python-load window (the pair and MLServer rows; perf_analyzer has its own windows)."""
    pair_concurrency: tuple[int, ...] = (4, 8)
    pair_tokens: tuple[int, int] = (2000, 4000)
    served_concurrency: tuple[int, ...] = (16, 32)
    load: str = "perf"
    """"perf" (perf_analyzer where it runs) or "python" (asyncio + httpx, binary tensors)."""

    @classmethod
    def quick(cls, load: str) -> Settings:
        return cls(rounds=1, seconds=3.0, pair_concurrency=(4,), served_concurrency=(16,), load=load)


@dataclass
class Row:
    """One line of the table: the two sides, their ratio (modelsvc side / other side) and how it was measured."""

    benchmark: str
    modelsvc: str
    other: str
    ratio: float | None
    notes: str
    rounds: list[float] = field(default_factory=list)
    """The per-round ratios whose median is ``ratio``."""
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------
# measuring


@dataclass
class Stats:
    """One closed-loop window of JSON requests."""

    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def json_load(url: str, bodies: Sequence[bytes], concurrency: int, seconds: float) -> Stats:
    """``concurrency`` clients POST ``bodies`` in turn to ``url`` for ``seconds`` (after a 1 s warm-up).

    Throughput counts the answers that arrive inside the window (a request may have been sent before it, so
    slow requests still count in a short window); latencies are theirs. An answer other than 200 is an error."""

    async def run() -> Stats:
        latencies: list[float] = []
        errors = 0
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
            start = time.perf_counter() + 1.0
            end = start + seconds

            async def worker(offset: int) -> None:
                nonlocal errors
                i = offset
                while (sent := time.perf_counter()) < end:
                    response = await client.post(url, content=bodies[i % len(bodies)], headers=headers)
                    done = time.perf_counter()
                    i += concurrency
                    if response.status_code != 200:
                        errors += 1
                    elif start <= done <= end:
                        latencies.append(done - sent)

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
        ms = np.asarray(latencies) * 1000.0 if latencies else np.asarray([math.nan])
        return Stats(len(latencies) / seconds, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), errors)

    return asyncio.run(run())


def v2_point(
    server: _servers.ServerProcess,
    model: str,
    concurrency: int,
    inputs: Sequence[Input],
    outputs: Sequence[str],
    workdir: Path,
    settings: Settings,
    input_json: Path | None = None,
) -> LoadResult:
    """One v2 binary-tensor point: bench_core's perf_analyzer run, or its Python load when asked or needed."""
    use_perf = settings.load == "perf" and _perf.perf_analyzer_problem() is None
    if use_perf:
        return bench_core.measure(server, model, concurrency, inputs, outputs, workdir, True, input_json)
    return _perf.run_python_load(server.base_url, model, inputs, outputs, concurrency, settings.seconds)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


# ---------------------------------------------------------------------------------------------------------
# the model repository shared by ceiling, batching and triton/mlserver (modelsvc side)


def write_repo(repo: Path) -> None:
    """bench_core's repository (identity, tok_batched, tok_tuned, tok_unbatched) plus ``tok_dyn``: the same model
    with a bare ``dynamic_batching {}``."""
    from tests.onnx_models import token_classifier, write_model

    bench_core.write_modelsvc_repo(repo)
    tok = token_classifier(
        vocab=bench_core.TOK_VOCAB, hidden=bench_core.TOK_HIDDEN, labels=bench_core.TOK_LABELS,
        layers=bench_core.TOK_LAYERS,
    )  # fmt: skip
    config = bench_core.TOK_CONFIG.format(
        name="tok_dyn", max_batch=bench_core.TOK_MAX_BATCH, labels=bench_core.TOK_LABELS, batching=TOK_DYN_CONFIG
    )
    write_model(repo, "tok_dyn", tok, config)


def tok_request(workdir: Path) -> tuple[list[Input], Path]:
    inputs = [Input(k, "INT64", v) for k, v in bench_core.tok_inputs(1).items()]
    return inputs, _perf.write_input_json(workdir / "suite_tok_input.json", inputs, variants=8)


def bench_ceiling(server: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    inputs, data = tok_request(workdir)
    ratios, served_best, ceilings = [], [], []
    for i in range(settings.rounds):
        print(f"  ceiling round {i + 1}/{settings.rounds}", flush=True)
        points = [
            (c, v2_point(server, "tok_tuned", c, inputs, ["logits"], workdir, settings, data))
            for c in settings.served_concurrency
        ]
        best_c, best = max(points, key=lambda p: p[1].infer_per_s)
        batch, rows_per_s, _ = max(bench_core.in_process_ceiling(), key=lambda c: c[1])
        served_best.append((best_c, best.infer_per_s))
        ceilings.append((batch, rows_per_s))
        ratios.append(best.infer_per_s / rows_per_s)
    served = median([s for _, s in served_best]) or 0.0
    ceiling = median([c for _, c in ceilings]) or 0.0
    return Row(
        "served / in-process ceiling",
        f"{served:.0f} infer/s (tok_tuned, c={'/'.join(str(c) for c, _ in served_best)})",
        f"{ceiling:.0f} rows/s (batch {'/'.join(str(b) for b, _ in ceilings)})",
        median(ratios),
        f"token_classifier(hidden={bench_core.TOK_HIDDEN}, layers={bench_core.TOK_LAYERS}) 1x{bench_core.SEQ} int64; "
        f"rounds {spread(ratios)}",
        ratios,
    )


def bench_batching(server: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    inputs, data = tok_request(workdir)
    ratios, on, off = [], [], []
    c = BATCHING_CONCURRENCY
    for i in range(settings.rounds):
        print(f"  batching round {i + 1}/{settings.rounds}", flush=True)
        with_batching = v2_point(server, "tok_dyn", c, inputs, ["logits"], workdir, settings, data)
        without = v2_point(server, "tok_unbatched", c, inputs, ["logits"], workdir, settings, data)
        on.append(with_batching)
        off.append(without)
        ratios.append(with_batching.infer_per_s / without.infer_per_s)
    tool = on[0].tool
    return Row(
        "dynamic batching on / off",
        f"{median([r.infer_per_s for r in on]):.0f} infer/s, p50 {median([r.p50_ms for r in on]):.1f} ms",
        f"{median([r.infer_per_s for r in off]):.0f} infer/s, p50 {median([r.p50_ms for r in off]):.1f} ms",
        median(ratios),
        f"same model, dynamic_batching {{}} vs none, c={c}, {tool}; rounds {spread(ratios)}",
        ratios,
    )


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
    from tests.interop._mlserver import MLServerProcess

    class IdentityMLServer(MLServerProcess):
        def write_folder(self) -> None:
            super().write_folder()  # settings.json (ports, no workers) and the echo model
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
    from tests._venvs import marker_of
    from tests.interop import _mlserver

    exe = _mlserver.VENV / "bin" / "mlserver"
    marker = marker_of(_mlserver.VENV)
    wanted = "\n".join(_mlserver.REQUIREMENTS)
    if exe.exists() and marker.exists() and marker.read_text() == wanted:
        return exe
    return None


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
# pair vs naive


@contextmanager
def naive_service() -> Iterator[str]:
    """loadtests/naive_service.py in a child process on a free port; yields its base URL."""
    from tests._server import ServerProcess

    class NaiveProcess(ServerProcess):
        ready_path = "/health/ready"

        @property
        def command(self) -> list[str]:
            return [sys.executable, "-m", "loadtests.naive_service", "--port", str(self.http_port)]

    with NaiveProcess() as proc:
        yield proc.base


def classify(base: str, documents: list[str]) -> list[dict[str, Any]]:
    response = httpx.post(f"{base}/v1/classify", json={"documents": documents}, timeout=120)
    response.raise_for_status()
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def correctness_guard(pair: str, naive: str, documents: list[str]) -> tuple[bool, str]:
    """Both services give each document the same label, probabilities within 1e-3, and the same window count."""
    ours, theirs = classify(pair, documents), classify(naive, documents)
    same = 0
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        pa = {s["label"]: s["probability"] for s in a["scores"]}
        pb = {s["label"]: s["probability"] for s in b["scores"]}
        diff = max(abs(pa[k] - pb[k]) for k in pa)
        worst = max(worst, diff)
        same += a["label"] == b["label"] and a["chunks"] == b["chunks"] and diff < 1e-3
    ok = same == len(documents)
    return ok, f"labels agree {same}/{len(documents)} (max probability difference {worst:.1e})"


def bench_pair(settings: Settings) -> list[Row]:
    from services import build
    from services.conftest import Pair

    build.build()
    docs = long_documents(24, *settings.pair_tokens, seed=8)
    bodies = [json.dumps({"documents": [text]}).encode() for _, text in docs]
    with ExitStack() as stack:
        print("  starting doc_classifier (modelsvc + logicd) and the naive service", flush=True)
        pair = stack.enter_context(Pair("doc_classifier")).base
        naive = stack.enter_context(naive_service())
        ok, guard = correctness_guard(pair, naive, [text for _, text in docs[:6]])
        if not ok:
            raise RuntimeError(f"correctness guard failed: {guard}")
        tokens = [r["tokens"] for r in classify(pair, [text for _, text in docs[:6]])]
        per: dict[int, tuple[list[Stats], list[Stats]]] = {c: ([], []) for c in settings.pair_concurrency}
        for i in range(settings.rounds):
            for c in settings.pair_concurrency:
                print(f"  pair vs naive round {i + 1}/{settings.rounds}, c={c}", flush=True)
                per[c][0].append(json_load(f"{pair}/v1/classify", bodies, c, settings.seconds))
                per[c][1].append(json_load(f"{naive}/v1/classify", bodies, c, settings.seconds))
    rows = []
    for c, (ours, theirs) in per.items():
        errors = sum(s.errors for s in ours + theirs)
        if errors:
            raise RuntimeError(f"{errors} failed requests at c={c}")
        ratios = [a.per_s / b.per_s for a, b in zip(ours, theirs, strict=True)]

        def side(stats: list[Stats]) -> str:
            return (f"{median([s.per_s for s in stats]):.2f} docs/s, p50 {median([s.p50_ms for s in stats]):.0f} ms, "
                    f"p99 {median([s.p99_ms for s in stats]):.0f} ms")  # fmt: skip

        rows.append(
            Row(
                f"pair / naive, long documents, c={c}",
                side(ours),
                side(theirs),
                median(ratios),
                f"{settings.pair_tokens[0]}-{settings.pair_tokens[1]} tokens/doc (e.g. {min(tokens)}-{max(tokens)}); "
                f"{guard}; rounds {spread(ratios)}",
                ratios,
                {"correct": ok},
            )
        )
    return rows


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
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_suite", description=__doc__.splitlines()[0])
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

    command = shlex.join(["python", "-m", "loadtests.bench_suite", *(sys.argv[1:] if argv is None else argv)])
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


if __name__ == "__main__":
    sys.exit(main())
