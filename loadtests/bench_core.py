"""Core benchmark of modelsvc: `python -m loadtests.bench_core` from the repository root.

(a)  identity 1x16 FP32 over HTTP with binary tensors at concurrency 1, 8, 32 (perf_analyzer)
(a') the same identity load at concurrency 8 against a real Triton 2.51 (nvidia-pytriton's tritonserver,
     python-backend identity model), when nvidia-pytriton is installed
(b)  a small transformer-like ONNX model, batch 1 x 128 tokens, concurrency 16, dynamic batching on vs off
(c)  the same ONNX model in-process with onnxruntime at batch 1..32: the best rows/s is the ceiling,
     and (b, batched) / ceiling is the serving efficiency (target >= 90 %)
(r)  the two targets measured in interleaved rounds with both servers up (the machine is shared and noisy,
     so one run each is not a comparison): modelsvc vs Triton at c=8, served vs ceiling; medians
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness import _perf, _servers
from loadtests.harness._main import run
from loadtests.harness._perf import Input, LoadResult

# The transformer-like model: ~1-1.5 ms for one batch-1 x 128-token call on a 2-core EPYC.
TOK_HIDDEN = 256
TOK_LAYERS = 32
TOK_VOCAB = 1000
TOK_LABELS = 4
SEQ = 128
TOK_MAX_BATCH = 32
TOK_QUEUE_DELAY_US = 1000
#: tok_tuned: what a configuration sweep picks for 16 clients: wait (up to 5 ms) for full batches of 16
TOK_TUNED_BATCHING = "dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 5000 }\n"
TOK_CONCURRENCY = 16
IDENTITY_CONCURRENCY = (1, 8, 32)
TRITON_CONCURRENCY = 8
CEILING_BATCHES = (1, 2, 4, 8, 16, 32)
CEILING_SECONDS = 2.0
CEILING_WINDOWS = 4
TARGET_RATIO = 0.90

IDENTITY_CONFIG = """\
name: "identity"
{engine}
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

TOK_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {labels} ] }} ]
{batching}instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


@dataclass
class Row:
    part: str
    server: str
    model: str
    result: LoadResult | None
    error: str = ""


# ---------------------------------------------------------------------------------------------------------
# model repositories


def tok_inputs(batch: int = 1, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, TOK_VOCAB, size=(batch, SEQ), dtype=np.int64)
    mask = np.ones((batch, SEQ), dtype=np.int64)
    mask[:, SEQ - SEQ // 8 :] = 0  # some padding, as a tokenizer would leave
    return {"input_ids": ids, "attention_mask": mask}


def write_modelsvc_repo(repo: Path) -> None:
    from modelsvc.tools.onnx_models import identity, token_classifier, write_model

    write_model(repo, "identity", identity(), IDENTITY_CONFIG.format(engine='platform: "onnxruntime_onnx"'))
    tok = token_classifier(vocab=TOK_VOCAB, hidden=TOK_HIDDEN, labels=TOK_LABELS, layers=TOK_LAYERS)
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {TOK_QUEUE_DELAY_US} }}\n"
    for name, block in (("tok_batched", batching), ("tok_tuned", TOK_TUNED_BATCHING), ("tok_unbatched", "")):
        config = TOK_CONFIG.format(name=name, max_batch=TOK_MAX_BATCH, labels=TOK_LABELS, batching=block)
        write_model(repo, name, tok, config)


# ---------------------------------------------------------------------------------------------------------
# (c) in-process ceiling


def ort_session(model_bytes: bytes) -> object:
    import onnxruntime as ort

    so = ort.SessionOptions()  # intra-op threads: default (one per core)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def in_process_ceiling() -> list[tuple[int, float, float]]:
    """(batch, rows/s, ms per call) for each batch size."""
    from modelsvc.tools.onnx_models import token_classifier

    model = token_classifier(vocab=TOK_VOCAB, hidden=TOK_HIDDEN, labels=TOK_LABELS, layers=TOK_LAYERS)
    sess = ort_session(model.SerializeToString())
    run: Callable[..., object] = sess.run  # type: ignore[attr-defined]
    out = []
    for batch in CEILING_BATCHES:
        feed = tok_inputs(batch)
        for _ in range(3):
            run(None, feed)
        best_s = float("inf")  # best of a few windows: the machine is shared, a ceiling should not dip
        for _ in range(CEILING_WINDOWS):
            calls, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < CEILING_SECONDS / CEILING_WINDOWS:
                run(None, feed)
                calls += 1
            best_s = min(best_s, elapsed / calls)
        out.append((batch, batch / best_s, 1000.0 * best_s))
    return out


# ---------------------------------------------------------------------------------------------------------
# load points


def measure(
    server: _servers.ServerProcess,
    model: str,
    concurrency: int,
    inputs: Sequence[Input],
    outputs: Sequence[str],
    workdir: Path,
    use_perf: bool,
    input_json: Path | None = None,
) -> LoadResult:
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    if use_perf:
        result, output, cmd = _perf.run_perf_analyzer(model, server.url, concurrency, workdir, input_json)
        if result is None:
            raise RuntimeError(f"perf_analyzer failed: {shlex.join(cmd)}\n{output[-3000:]}")
    else:
        result = _perf.run_python_load(server.base_url, model, inputs, outputs, concurrency)
    result.server_cpu_pct = 100.0 * (server.cpu_seconds() - cpu0) / (time.perf_counter() - t0)
    return result


def identity_inputs() -> list[Input]:
    return [Input("INPUT0", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16))]


def run_modelsvc(workdir: Path, use_perf: bool, parts: set[str], rows: list[Row]) -> None:
    repo = workdir / "modelsvc_repo"
    write_modelsvc_repo(repo)
    tok_in = [Input(k, "INT64", v) for k, v in tok_inputs(1).items()]
    tok_json = _perf.write_input_json(workdir / "tok_input.json", tok_in, variants=8)
    try:
        server_cm = _servers.modelsvc_server(repo)
        server = server_cm.__enter__()
    except Exception as exc:
        rows.append(Row("a" if "a" in parts else "b", "modelsvc", "(server start)", None, str(exc)))
        return
    try:
        points: list[tuple[str, str, int, list[Input], list[str], Path | None]] = []
        if "a" in parts:
            points += [("a", "identity", c, identity_inputs(), ["OUTPUT0"], None) for c in IDENTITY_CONCURRENCY]
        if "b" in parts:
            points += [
                ("b", name, TOK_CONCURRENCY, tok_in, ["logits"], tok_json)
                for name in ("tok_batched", "tok_tuned", "tok_unbatched")
            ]
        for part, model, conc, inputs, outputs, data in points:
            label = f"{model} c={conc}"
            try:
                res = measure(server, model, conc, inputs, outputs, workdir, use_perf, data)
                rows.append(Row(part, "modelsvc", label, res))
            except Exception as exc:
                rows.append(Row(part, "modelsvc", label, None, f"{exc}\n--- server log ---\n{server.log_tail(1500)}"))
    finally:
        server_cm.__exit__(None, None, None)


def run_triton(workdir: Path, use_perf: bool, rows: list[Row]) -> None:
    label = f"identity (python backend) c={TRITON_CONCURRENCY}"
    if _servers.pytriton_dir() is None:
        rows.append(Row("a'", "triton 2.51", label, None, "not installed (pip install nvidia-pytriton)"))
        return
    repo = workdir / "triton_repo"
    _servers.write_triton_identity(repo, "identity", IDENTITY_CONFIG.format(engine='backend: "python"'))
    try:
        with _servers.triton_server(repo, workdir) as server:
            res = measure(server, "identity", TRITON_CONCURRENCY, identity_inputs(), ["OUTPUT0"], workdir, use_perf)
            rows.append(Row("a'", "triton 2.51", label, res))
    except Exception as exc:
        rows.append(Row("a'", "triton 2.51", label, None, str(exc)))


# ---------------------------------------------------------------------------------------------------------
# (r) interleaved rounds: the comparisons that carry a target, measured back to back, several times


@dataclass
class Round:
    modelsvc_identity: float | None
    triton_identity: float | None
    served_tok: float | None
    served_tuned: float | None
    ceiling: float
    ceiling_batch: int


def run_rounds(workdir: Path, rounds: int) -> list[Round]:
    """Both servers up at once; each round measures modelsvc c=8, Triton c=8, served tok_batched, ceiling."""
    repo = workdir / "rounds_modelsvc_repo"
    write_modelsvc_repo(repo)
    tok_in = [Input(k, "INT64", v) for k, v in tok_inputs(1).items()]
    tok_json = _perf.write_input_json(workdir / "rounds_tok_input.json", tok_in, variants=8)
    triton_cm = None
    if _servers.pytriton_dir() is not None:
        triton_repo = workdir / "rounds_triton_repo"
        _servers.write_triton_identity(triton_repo, "identity", IDENTITY_CONFIG.format(engine='backend: "python"'))
        triton_cm = _servers.triton_server(triton_repo, workdir)
    out: list[Round] = []
    with _servers.modelsvc_server(repo) as modelsvc:
        triton = triton_cm.__enter__() if triton_cm is not None else None
        try:
            for i in range(rounds):
                print(f"  round {i + 1}/{rounds} ...", flush=True)
                ident = measure(modelsvc, "identity", TRITON_CONCURRENCY, identity_inputs(), ["OUTPUT0"], workdir, True)
                trit = None
                if triton is not None:
                    trit = measure(
                        triton, "identity", TRITON_CONCURRENCY, identity_inputs(), ["OUTPUT0"], workdir, True
                    ).infer_per_s
                tok = measure(modelsvc, "tok_batched", TOK_CONCURRENCY, tok_in, ["logits"], workdir, True, tok_json)
                tuned = measure(modelsvc, "tok_tuned", TOK_CONCURRENCY, tok_in, ["logits"], workdir, True, tok_json)
                best = max(in_process_ceiling(), key=lambda c: c[1])
                out.append(Round(ident.infer_per_s, trit, tok.infer_per_s, tuned.infer_per_s, best[1], best[0]))
        finally:
            if triton_cm is not None:
                triton_cm.__exit__(None, None, None)
    return out


def print_rounds(rounds: list[Round]) -> None:
    def med(values: list[float]) -> float:
        return float(np.median(values)) if values else float("nan")

    print(
        f"\n(r) interleaved rounds, both servers up, each round back to back (identity c={TRITON_CONCURRENCY}, "
        f"tok_* c={TOK_CONCURRENCY}, ceiling = best in-process batch)"
    )
    print(
        f"{'round':>5} {'modelsvc':>9} {'triton':>9} {'ms/triton':>9} {'batched':>8} {'tuned':>8} "
        f"{'ceiling':>8} {'batched/ceil':>12} {'tuned/ceil':>10}"
    )
    for i, r in enumerate(rounds, 1):
        ident = r.modelsvc_identity or 0.0
        trit = f"{r.triton_identity:9.0f}" if r.triton_identity else f"{'-':>9}"
        ratio = f"{ident / r.triton_identity:9.2f}" if r.triton_identity else f"{'-':>9}"
        batched, tuned = r.served_tok or 0.0, r.served_tuned or 0.0
        print(
            f"{i:>5} {ident:9.0f} {trit} {ratio} {batched:8.0f} {tuned:8.0f} {r.ceiling:8.0f} "
            f"{batched / r.ceiling:12.1%} {tuned / r.ceiling:10.1%}"
        )
    ms_triton = [r.modelsvc_identity / r.triton_identity for r in rounds if r.modelsvc_identity and r.triton_identity]
    if ms_triton:
        verdict = "meets" if med(ms_triton) >= 1.0 else "BELOW"
        print(f"median modelsvc / triton (identity c={TRITON_CONCURRENCY}): {med(ms_triton):.2f} ({verdict} 1.00)")
    for label, values in (
        ("tok_batched", [(r.served_tok or 0.0) / r.ceiling for r in rounds]),
        ("tok_tuned", [(r.served_tuned or 0.0) / r.ceiling for r in rounds]),
    ):
        verdict = "meets" if med(values) >= TARGET_RATIO else "BELOW"
        print(f"median served / ceiling ({label}): {med(values):.1%} ({verdict} the {TARGET_RATIO:.0%} target)")


# ---------------------------------------------------------------------------------------------------------
# report


def machine_line() -> str:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"machine: nproc={os.cpu_count()}  cpu={cpu}  flags={simd_flags()}  python={platform.python_version()}"


SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
"""The CPU flags that decide what the runtimes compute with (fp32 vector width, bf16, int8 dot products, AMX)."""


def simd_flags() -> str:
    """Which of SIMD_FLAGS this CPU has, as /proc/cpuinfo names them ("none" when it has none or cannot say)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return ",".join(f for f in SIMD_FLAGS if f in have) or "none"


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_load_table(rows: list[Row]) -> None:
    head = (
        f"{'part':<4} {'server':<12} {'model / concurrency':<36} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'srv CPU%':>8} {'cli CPU%':>8} {'batch':>5}  tool"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.result is None:
            first = r.error.strip().splitlines()[0] if r.error.strip() else "failed"
            print(f"{r.part:<4} {r.server:<12} {r.model:<36} {'FAILED / SKIPPED: ' + first}")
            continue
        x = r.result
        note = f" ({x.note})" if x.note else ""
        print(
            f"{r.part:<4} {r.server:<12} {r.model:<36} {x.infer_per_s:>9.0f}"
            f" {x.p50_ms:>8.2f} {x.p99_ms:>8.2f}"
            f" {_fmt(x.server_cpu_pct, '>8.0f')} {_fmt(x.client_cpu_pct, '>8.0f')}"
            f" {_fmt(x.avg_batch, '>5.1f')}  {x.tool}{note}"
        )


def print_breakdowns(rows: list[Row]) -> None:
    lines = [(r, r.result.server_breakdown) for r in rows if r.result and r.result.server_breakdown]
    if lines:
        print("\nserver-side average per request (from the server's statistics, via perf_analyzer):")
        for r, text in lines:
            print(f"  {r.server} {r.model}: {text}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_core", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", default="a,a',b,c,r", help="comma-separated subset of a, a2 (= a'), b, c, r (default all)"
    )
    parser.add_argument("--python-load", action="store_true", help="use the Python load generator, not perf_analyzer")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of part r, the interleaved comparison (default 3)"
    )
    args = parser.parse_args(argv)
    parts = {p.strip().replace("a2", "a'") for p in args.parts.split(",") if p.strip()}

    print(machine_line())
    print("command: " + shlex.join([Path(sys.executable).name, "-m", "loadtests.bench_core", *sys.argv[1:]]))
    problem = None if args.python_load else _perf.perf_analyzer_problem()
    use_perf = not args.python_load and problem is None
    if use_perf:
        print(f"load generator: perf_analyzer ({_perf.perf_analyzer_path()}), HTTP, binary tensors, "
              f"{_perf.WINDOW_MS} ms windows")  # fmt: skip
    else:
        why = "--python-load" if args.python_load else problem
        print(f"load generator: FALLBACK Python asyncio+httpx (binary tensors) because: {why}")
    print(
        f"token model: token_classifier(hidden={TOK_HIDDEN}, layers={TOK_LAYERS}), [1,{SEQ}] int64 x2, "
        f"tok_batched: max_batch_size {TOK_MAX_BATCH}, max_queue_delay_microseconds {TOK_QUEUE_DELAY_US}; "
        "tok_unbatched: no dynamic_batching"
    )
    print(flush=True)

    ceiling: list[tuple[int, float, float]] = []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_core-") as tmp:
        workdir = Path(tmp)
        if "c" in parts:
            ceiling = in_process_ceiling()  # first, on a quiet machine
        if parts & {"a", "b"}:
            run_modelsvc(workdir, use_perf, parts, rows)
        if "a'" in parts:
            run_triton(workdir, use_perf, rows)
        rounds = run_rounds(workdir, args.rounds) if "r" in parts and use_perf else []

    rows.sort(key=lambda r: ["a", "a'", "b"].index(r.part))
    if rows:
        print_load_table(rows)
        print_breakdowns(rows)
    if ceiling:
        print()
        print(
            "(c) in-process onnxruntime, CPUExecutionProvider, allow_spinning 0, default intra-op threads, "
            f"best of {CEILING_WINDOWS} windows"
        )
        print(f"{'batch':>5} {'rows/s':>9} {'ms/call':>8}")
        for batch, rps, ms in ceiling:
            print(f"{batch:>5} {rps:>9.0f} {ms:>8.2f}")
        best = max(ceiling, key=lambda c: c[1])
        print(f"ceiling: {best[1]:.0f} rows/s at batch {best[0]}")
        for name in ("tok_batched", "tok_tuned"):
            served = next((r.result for r in rows if r.model.startswith(name) and r.result), None)
            if served is None:
                continue
            ratio = served.infer_per_s / best[1]
            verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
            print(f"served {name} / ceiling = {served.infer_per_s:.0f} / {best[1]:.0f} = {ratio:.1%} "
                  f"({verdict} the {TARGET_RATIO:.0%} target)")  # fmt: skip
            avg = served.avg_batch
            if avg:
                # Compare with the in-process rate at the batch size the server actually ran.
                near = min(ceiling, key=lambda c: abs(c[0] - avg))
                print(f"served {name} / in-process at batch {near[0]} (server's average batch "
                      f"{avg:.1f}) = {served.infer_per_s / near[1]:.1%}")  # fmt: skip
    if rounds:
        print_rounds(rounds)
    errors = [r for r in rows if r.result is None and r.error and "not installed" not in r.error]
    if errors:
        print("\nerrors:")
        for r in errors:
            print(f"--- {r.part} {r.server} {r.model}\n{r.error.strip()}\n")
    return 1 if errors else 0


if __name__ == "__main__":
    run(main)
