"""Sequences per second of BERT encoders on one GPU, three ways, beside the bound the GPU's FLOP rate allows.

    python -m loadtests.gpu.bench_gpu \\
        --model name=bert_base,layers=12,hidden=768,onnx=A/1/model.onnx,plan=B/1/model.plan \\
        --url localhost:8000 --budget-s 240

For each model and each batch x tokens cell (batch 1, 8, 32, 64 x 128, 512 tokens by default):

- **TensorRT (in-process)**: ``modelsvc.backends.tensorrt._tensorrt_engine.PlanEngine(plan, device=0, profile=0)``,
  ``infer(feeds, outputs)`` from numpy to numpy (host to device copies, the run, the outputs asked for copied
  back);
- **ONNX Runtime CUDA**: an ``InferenceSession`` of the same ONNX file on ``CUDAExecutionProvider``, converted to
  fp16 (inputs and outputs kept: ``keep_io_types``) like the fp16 plan, or fp32 where that conversion fails
  (the header says which); fetching the same outputs;
- **served plan**: the plan served by ``modelsvc serve`` (``served=NAME``, default the model's name), tritonclient
  HTTP with binary tensors, ``concurrency`` requests in flight from as many threads (enough to fill the dynamic
  batcher's batches: 2 x max_batch_size / batch, 4 to 64), asking for ``sentence_embedding`` where the model has it.

Every cell is bounded by time: one warm-up call, then calls until ``seconds`` per cell have passed (derived from
``--budget-s``); a cell the budget no longer covers prints ``-``.

The bound: a BERT encoder needs about ``2 x P x T + 4 x L x T^2 x H`` FLOPs per sequence of T tokens (P the
encoder's weights, L layers, H hidden; the first term is every weight's multiply-add per token, the second the
attention scores QK^T and their product with V). P = L x (4H^2 + 2HI + 9H + I) with I the feed-forward width
(4H): the four attention projections, the two feed-forward matrices, their biases and two LayerNorms; the
embeddings are lookups, not FLOPs. The GPU's peak dense fp16 tensor-core rate comes from :data:`PEAK_FP16_TFLOPS`
by the name nvidia-smi prints, or ``--peak-tflops``; bound = peak / FLOPs per sequence (sequences/s).

The pure parts (the FLOP arithmetic, the peak table, the model spec, the table's text) are tested on any machine
in tests/loadtests/test_gpu_verify.py; the measuring needs a GPU, TensorRT and a running server.
"""

from __future__ import annotations

import argparse
import math
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._ort_cuda import onnx_io, ort_cuda_session

BATCHES = (1, 8, 32, 64)
TOKENS = (128, 512)
RUNNERS = ("tensorrt", "ort_cuda", "served")
HEADERS = {"tensorrt": "TensorRT (in-process)", "ort_cuda": "ORT CUDA", "served": "served plan (HTTP)"}

#: (pattern on nvidia-smi's GPU name, peak dense fp16 tensor TFLOP/s from NVIDIA's data sheets); first match wins,
#: so the narrower names come first (H100 PCIe before H100, A100 before A10, L40S before L4)
PEAK_FP16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756.0),
    (r"\bH100\b.*\bNVL\b", 835.0),
    (r"\bH100\b", 989.0),  # SXM (nvidia-smi: "NVIDIA H100 80GB HBM3")
    (r"\bH200\b", 989.0),
    (r"\bGH200\b", 989.0),
    (r"\bB200\b", 2250.0),
    (r"\bA100\b", 312.0),
    (r"\bA10G\b", 70.0),
    (r"\bA10\b", 125.0),
    (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bT4\b", 65.0),
    (r"\bV100\b", 125.0),
)


# --- the FLOP bound (pure) --------------------------------------------------------------------------------


def encoder_params(layers: int, hidden: int, intermediate: int | None = None) -> int:
    """Weights of a BERT encoder's layers: L x (4H^2 + 2HI + 9H + I); I defaults to 4H. Embeddings excluded."""
    if layers < 1 or hidden < 1:
        raise ValueError(f"layers and hidden must be positive, got layers={layers} hidden={hidden}")
    i = 4 * hidden if intermediate is None else intermediate
    return layers * (4 * hidden * hidden + 2 * hidden * i + 9 * hidden + i)


def flops_per_sequence(params: int, layers: int, hidden: int, tokens: int) -> float:
    """About 2 x params x tokens (a multiply-add per weight per token) + 4 x layers x tokens^2 x hidden (attention)."""
    return 2.0 * params * tokens + 4.0 * layers * tokens * tokens * hidden


def bound_sequences_per_s(peak_tflops: float, flops: float) -> float:
    """Sequences per second that ``peak_tflops`` allows at ``flops`` per sequence."""
    return peak_tflops * 1e12 / flops


def peak_tflops_for(gpu_name: str) -> float | None:
    """The peak dense fp16 tensor TFLOP/s of a GPU by nvidia-smi's name, or None when the table lacks it."""
    for pattern, tflops in PEAK_FP16_TFLOPS:
        if re.search(pattern, gpu_name, re.IGNORECASE):
            return tflops
    return None


# --- what to measure (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    onnx: Path
    plan: Path
    served: str
    intermediate: int | None = None

    @property
    def params(self) -> int:
        return encoder_params(self.layers, self.hidden, self.intermediate)


_SPEC_KEYS = {"name", "layers", "hidden", "intermediate", "onnx", "plan", "served"}


def parse_model_spec(text: str) -> ModelSpec:
    """``name=N,layers=L,hidden=H,onnx=FILE,plan=FILE[,served=NAME][,intermediate=I]`` -> ModelSpec."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise ValueError(f"--model {text!r}: {part!r} is not KEY=VALUE")
        if key not in _SPEC_KEYS:
            raise ValueError(f"--model {text!r}: unknown key {key!r} (keys: {', '.join(sorted(_SPEC_KEYS))})")
        if key in fields:
            raise ValueError(f"--model {text!r}: {key} given twice")
        fields[key] = value.strip()
    missing = [k for k in ("name", "layers", "hidden", "onnx", "plan") if k not in fields]
    if missing:
        raise ValueError(f"--model {text!r}: missing {', '.join(missing)}")
    numbers: dict[str, int] = {}
    for key in ("layers", "hidden", "intermediate"):
        if key in fields:
            try:
                numbers[key] = int(fields[key])
            except ValueError:
                raise ValueError(f"--model {text!r}: {key} must be an integer, got {fields[key]!r}") from None
            if numbers[key] < 1:
                raise ValueError(f"--model {text!r}: {key} must be positive, got {numbers[key]}")
    return ModelSpec(
        name=fields["name"],
        layers=numbers["layers"],
        hidden=numbers["hidden"],
        intermediate=numbers.get("intermediate"),
        onnx=Path(fields["onnx"]),
        plan=Path(fields["plan"]),
        served=fields.get("served", fields["name"]),
    )


def concurrency_for(batch: int, max_batch_size: int) -> int:
    """Requests in flight for the served runner: two full batches of the dynamic batcher, 4 to 64."""
    return max(4, min(64, 2 * max(1, max_batch_size) // batch))


def seconds_per_cell(budget_s: float, cells: int, floor: float = 0.3, ceiling: float = 2.0) -> float:
    """Measuring time per cell: 70 % of the budget shared out (the rest: sessions, engines, warm-ups)."""
    if cells < 1:
        return ceiling
    return max(floor, min(ceiling, 0.7 * budget_s / cells))


@dataclass
class Row:
    model: str
    batch: int
    tokens: int
    bound: float | None
    #: runner -> sequences/s, or a short note ("-" not measured, "error: ...")
    results: dict[str, float | str] = field(default_factory=dict)


def _number(value: float | str | None) -> str:
    if value is None:
        return "?"
    if isinstance(value, str):
        return value
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def format_table(rows: Sequence[Row], *, gpu: str, peak_tflops: float | None, ort_precision: str) -> str:
    """The table verify.sh prints: sequences/s per runner beside the FLOP bound and the best runner's share of it."""
    headers = ["model", "batch", "tokens", HEADERS["tensorrt"], f"{HEADERS['ort_cuda']} {ort_precision}"]
    headers += [HEADERS["served"], "FLOP bound", "best/bound"]
    body: list[list[str]] = []
    for row in rows:
        measured = [v for v in row.results.values() if isinstance(v, float)]
        share = f"{100 * max(measured) / row.bound:.1f} %" if measured and row.bound else "?"
        cells = [row.model, str(row.batch), str(row.tokens)]
        cells += [_number(row.results.get(r, "-")) for r in RUNNERS]
        cells += [_number(row.bound), share]
        body.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    peak = f"{peak_tflops:g} TFLOP/s dense fp16 tensor peak" if peak_tflops else "peak unknown (give --peak-tflops)"
    out = [
        f"GPU: {gpu} | {peak} | sequences/s",
        "FLOP bound = peak / (2 x P x T + 4 x L x T^2 x H) per sequence; P = L x (4H^2 + 2HI + 9H + I)",
        line(headers),
        line(["-" * w for w in widths]),
        *(line(c) for c in body),
    ]
    return "\n".join(out)


# --- measuring (needs a GPU) --------------------------------------------------------------------------------


def measure(call: Callable[[], object], batch: int, seconds: float, deadline: float) -> float | str:
    """Sequences per second of ``call`` (one batch each): a warm-up call, then calls for ``seconds``."""
    if time.monotonic() + seconds > deadline:
        return "-"
    call()
    calls = 0
    start = time.monotonic()
    end = start + seconds
    while True:
        call()
        calls += 1
        now = time.monotonic()
        if now >= end:
            return batch * calls / (now - start)


def make_feeds(inputs: Mapping[str, Any], batch: int, tokens: int, seed: int = 0) -> dict[str, Any]:
    """Random token ids (1000..29999), attention masks of ones, token types of zeros: name -> numpy array."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype in inputs.items():
        if "mask" in name:
            feeds[name] = np.ones((batch, tokens), dtype=dtype)
        elif "type" in name:
            feeds[name] = np.zeros((batch, tokens), dtype=dtype)
        else:
            feeds[name] = rng.integers(1000, 30000, size=(batch, tokens)).astype(dtype)
    return feeds


def measure_window(
    submit: Callable[[], Any], batch: int, concurrency: int, seconds: float, deadline: float
) -> float | str:
    """Sequences per second with ``concurrency`` requests always in flight (``submit()`` -> a handle with
    ``get_result()``): a warm-up wave, then answers counted for ``seconds``; the rest drained, not counted."""
    if time.monotonic() + seconds > deadline:
        return "-"
    for handle in [submit() for _ in range(concurrency)]:
        handle.get_result()
    pending = [submit() for _ in range(concurrency)]
    done = 0
    start = time.monotonic()
    end = start + seconds
    while True:
        pending.pop(0).get_result()
        done += 1
        now = time.monotonic()
        if now >= end:
            break
        pending.append(submit())
    for handle in pending:
        handle.get_result()
    return batch * done / (now - start)


class _Call:
    """One request handed to a ``Served`` worker thread; ``get_result()`` waits for its answer."""

    def __init__(self) -> None:
        self.future: Future[Any] = Future()

    def get_result(self) -> Any:
        return self.future.result()


class Served:
    """The served model over tritonclient HTTP with binary tensors: ``concurrency`` threads, each with its own
    blocking client. tritonclient's ``async_infer`` answered about 90 requests/s however many were in flight, on
    this project's 2-core machine and on an H200 machine alike (cause not established), where blocking clients in
    8 threads reached about 1,900 requests/s on the 2-core machine: it capped the served column."""

    def __init__(self, url: str, model: str, inputs: Mapping[str, Any], outputs: Sequence[str]) -> None:
        self.url = url
        self.model = model
        self.inputs = inputs
        self.outputs = list(outputs)

    def submitter(self, batch: int, tokens: int, concurrency: int) -> tuple[Callable[[], Any], Callable[[], None]]:
        """(submit one request -> a handle with ``get_result()``, close the threads and their clients)."""
        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        infer_inputs = []
        for name, array in make_feeds(self.inputs, batch, tokens).items():
            item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array, binary_data=True)
            infer_inputs.append(item)
        wanted = [httpclient.InferRequestedOutput(o, binary_data=True) for o in self.outputs]
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()

        def work() -> None:
            # a client belongs to the thread that made it (geventhttpclient: one gevent hub per thread); closed here
            client = httpclient.InferenceServerClient(self.url, network_timeout=120)
            try:
                while (call := calls.get()) is not None:
                    try:
                        call.future.set_result(client.infer(self.model, infer_inputs, outputs=wanted))
                    except Exception as exc:
                        call.future.set_exception(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=work, daemon=True) for _ in range(concurrency)]
        for thread in threads:
            thread.start()

        def submit() -> _Call:
            call = _Call()
            calls.put(call)
            return call

        def close() -> None:
            for _ in threads:
                calls.put(None)
            for thread in threads:
                thread.join(timeout=130)

        return submit, close


def _plan_engine(plan: Path) -> Any:
    from modelsvc.backends.tensorrt._tensorrt_engine import PlanEngine

    return PlanEngine(plan.read_bytes(), device=0, profile=0)


def run_model(
    spec: ModelSpec,
    args: argparse.Namespace,
    seconds: float,
    deadline: float,
    *,
    engine_factory: Callable[[Path], Any] = _plan_engine,
    session_factory: Callable[[Path], tuple[Any, str]] = ort_cuda_session,
) -> tuple[list[Row], str]:
    """Every cell of one model: TensorRT in-process, then ONNX Runtime CUDA, then the served plan. Each runner asks
    for the same outputs (``sentence_embedding`` where the model has it); a runner that cannot start (no engine, no
    CUDA session) fills its own column with its error and the others still run."""
    rows = []
    for tokens in args.tokens:
        flops = flops_per_sequence(spec.params, spec.layers, spec.hidden, tokens)
        bound = bound_sequences_per_s(args.peak, flops) if args.peak else None
        rows += [Row(spec.name, batch, tokens, bound) for batch in args.batches]
    inputs, output_names = onnx_io(spec.onnx)
    wanted = ["sentence_embedding"] if "sentence_embedding" in output_names else output_names

    def each(runner: str, measure_cell: Callable[[int, int], float | str]) -> None:
        for row in rows:
            try:
                row.results[runner] = measure_cell(row.batch, row.tokens)
            except Exception as exc:  # one cell's failure is reported in its cell and below; the others still run
                row.results[runner] = f"error: {type(exc).__name__}"
                print(f"bench_gpu: {spec.name} {runner} batch {row.batch} x {row.tokens}: {exc}", file=sys.stderr)

    def started(runner: str, start: Callable[[], Any]) -> Any:
        try:
            return start()
        except Exception as exc:  # its column says so; the next runner still runs
            print(f"bench_gpu: {spec.name} {runner}: cannot start: {exc}", file=sys.stderr)
            for row in rows:
                row.results[runner] = f"error: {type(exc).__name__}"
            return None

    engine = started("tensorrt", lambda: engine_factory(spec.plan))
    if engine is not None:

        def tensorrt(batch: int, tokens: int) -> float | str:
            feeds = make_feeds(inputs, batch, tokens)
            return measure(lambda: engine.infer(feeds, wanted), batch, seconds, deadline)

        try:
            each("tensorrt", tensorrt)
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()

    precision = "fp16"
    ort = started("ort_cuda", lambda: session_factory(spec.onnx))
    if ort is not None:
        session, precision = ort

        def ort_cuda(batch: int, tokens: int) -> float | str:
            feeds = make_feeds(inputs, batch, tokens)
            return measure(lambda: session.run(wanted, feeds), batch, seconds, deadline)

        each("ort_cuda", ort_cuda)
    if args.url:
        served = Served(args.url, spec.served, inputs, wanted)

        def served_cell(batch: int, tokens: int) -> float | str:
            concurrency = concurrency_for(batch, max(args.batches))
            submit, close = served.submitter(batch, tokens, concurrency)
            try:
                return measure_window(submit, batch, concurrency, seconds, deadline)
            finally:
                close()

        each("served", served_cell)
    return rows, precision


def gpu_name() -> str:
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"bench_gpu: nvidia-smi failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[0]


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers A,B,..., got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="SPEC", help="see the module docstring")
    parser.add_argument("--url", default="", help="the server's HTTP address (host:port); empty: no served row")
    parser.add_argument("--batches", type=_ints, default=BATCHES, metavar="A,B,...")
    parser.add_argument("--tokens", type=_ints, default=TOKENS, metavar="A,B,...")
    parser.add_argument("--budget-s", type=float, default=240.0, help="time for every measurement (default 240)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak fp16 TFLOP/s (default: table)")
    parser.add_argument("--gpu-name", default=None, help="default: nvidia-smi's name of GPU 0")
    args = parser.parse_args(argv)
    try:
        specs = [parse_model_spec(m) for m in args.model]
    except ValueError as exc:
        parser.error(str(exc))
    name = args.gpu_name or gpu_name()
    args.peak = args.peak_tflops or peak_tflops_for(name)
    cells = len(specs) * len(args.batches) * len(args.tokens) * (3 if args.url else 2)
    seconds = seconds_per_cell(args.budget_s, cells)
    deadline = time.monotonic() + args.budget_s
    rows: list[Row] = []
    precision = "fp16"
    for spec in specs:
        got, precision = run_model(spec, args, seconds, deadline)
        rows += got
    print(format_table(rows, gpu=name, peak_tflops=args.peak, ort_precision=precision))
    failed = [r for r in rows for v in r.results.values() if isinstance(v, str) and v.startswith("error")]
    if failed:
        print(f"bench_gpu: {len(failed)} measurement(s) failed (see the lines above the table)", file=sys.stderr)
        return 1
    if any(not math.isfinite(v) for r in rows for v in r.results.values() if isinstance(v, float)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
