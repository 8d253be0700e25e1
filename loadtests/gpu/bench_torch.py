"""The PyTorch backend on a GPU, served: a BERT-shaped TorchScript encoder (random weights) as KIND_GPU (fp32 and
fp16) and KIND_CPU instances of one modelsvc, checked and then measured over tritonclient HTTP.

    python -m loadtests.gpu.bench_torch [--budget-s 150] [--batches 1,8,32] [--tokens 128] [--layers 6 --hidden 384]

Checks, each printed as ``CHECK <name> PASS|FAIL <detail>`` (exit status 1 when one fails):
  placement   the server's log says the GPU models' instances loaded on gpu:0, the CPU model's on cpu;
  same-result the GPU models' embeddings match the CPU model's for one batch (fp32 atol 1e-3, fp16 atol 5e-2);
  gpu-metrics the metrics port shows nv_gpu_utilization, nv_gpu_memory_used_bytes and nv_gpu_memory_total_bytes
              for a GPU, memory used above zero while the models are loaded.
Then the table: sequences/s per model and batch size, ``concurrency_for(batch, 64)`` requests in flight into the
dynamic batcher (max_batch_size 64), each cell ``--seconds`` long after a warm-up wave. It needs torch, and a CUDA
GPU for the GPU rows (``--kinds cpu`` runs the CPU row alone, e.g. on a machine without one).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.gpu.bench_gpu import Served, concurrency_for, make_feeds, measure_window
from loadtests.harness._servers import ServerProcess, modelsvc_server

VOCAB = 30522
INPUTS = {"input_ids": np.int64, "attention_mask": np.int64}
#: model name -> (instance kind, weights' dtype)
KINDS = {"gpu": ("KIND_GPU", "fp32"), "gpu_fp16": ("KIND_GPU", "fp16"), "cpu": ("KIND_CPU", "fp32")}
#: the fp16 model against the fp32 CPU model: a loose bound, to catch garbage rather than rounding
ATOL = {"fp32": 1e-3, "fp16": 5e-2}


def encoder(layers: int, hidden: int) -> Any:
    """An encoder shaped like BERT's (heads of 64, feed-forward 4 x hidden), masked mean pooling on top."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, hidden)
            layer = torch.nn.TransformerEncoderLayer(hidden, hidden // 64, 4 * hidden, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
            mask = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    torch.manual_seed(0)
    return Encoder().eval()


def config(name: str, kind: str, dtype: str, hidden: int) -> str:
    gpus = " gpus: [ 0 ]" if kind == "KIND_GPU" else ""
    out = "TYPE_FP16" if dtype == "fp16" else "TYPE_FP32"
    return f"""name: "{name}"
backend: "pytorch"
max_batch_size: 64
input [ {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
        {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }} ]
output [ {{ name: "embeddings" data_type: {out} dims: [ {hidden} ] }} ]
instance_group [ {{ kind: {kind} count: 1{gpus} }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""


def write_repository(repo: Path, names: list[str], layers: int, hidden: int) -> None:
    """One TorchScript file per weights' dtype, one model folder per name in ``names``."""
    import torch

    scripted: dict[str, Any] = {}
    for name in names:
        kind, dtype = KINDS[name]
        if dtype not in scripted:
            module = encoder(layers, hidden)
            with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.x; Triton's backend serves it
                warnings.simplefilter("ignore")
                scripted[dtype] = torch.jit.script(module.half() if dtype == "fp16" else module)
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        torch.jit.save(scripted[dtype], str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(config(name, kind, dtype, hidden))


def torch_server(repo: Path, log: Path) -> ServerProcess:
    """``python -m modelsvc serve`` on free ports, its metrics sampled every 200 ms, its log kept in ``log``."""
    metrics = ["--metrics-address", "127.0.0.1", "--metrics-interval-ms", "200"]
    return modelsvc_server(repo, 120.0, as_module=True, extra_args=metrics, log=log)


def check(name: str, ok: bool, detail: str, failed: list[str]) -> None:
    print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    if not ok:
        failed.append(name)


def infer(url: str, model: str, batch: int, tokens: int) -> np.ndarray[Any, Any]:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        inputs = []
        for name, array in make_feeds(INPUTS, batch, tokens, seed=1).items():
            array[:, tokens // 2 :] = 0 if "mask" in name else array[:, tokens // 2 :]  # half the rows padded
            item = httpclient.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(array, binary_data=True)
            inputs.append(item)
        result: np.ndarray[Any, Any] = client.infer(model, inputs).as_numpy("embeddings")
        return result


def metric_samples(port: int) -> dict[str, float]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    samples = {}
    for line in text.splitlines():
        match = re.match(r"(nv_gpu_\w+)\{[^}]*\}\s+(\S+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def run_checks(server: ServerProcess, names: list[str], tokens: int, failed: list[str]) -> None:
    log = server.log_text()
    for name in names:
        device = "gpu:0" if KINDS[name][0] == "KIND_GPU" else "cpu"
        shown = re.findall(rf"loaded model '{name}' version \d+: \d+ instance\(s\) on ([^\n]*)", log)
        check(f"placement-{name}", any(s.startswith(device) for s in shown), f"wanted {device}: {shown}", failed)
    url = server.url
    if "cpu" in names:
        reference = infer(url, "cpu", 4, tokens)
        for name in names:
            if name == "cpu":
                continue
            got = infer(url, name, 4, tokens).astype(np.float32)
            diff = float(np.max(np.abs(got - reference)))
            atol = ATOL[KINDS[name][1]]
            check(f"same-result-{name}", diff <= atol, f"max |{name} - cpu| = {diff:.2e} (atol {atol})", failed)
    if any(KINDS[n][0] == "KIND_GPU" for n in names):
        wanted = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes")
        samples: dict[str, float] = {}
        for _ in range(25):
            assert server.metrics_port is not None
            samples = metric_samples(server.metrics_port)
            if all(w in samples for w in wanted):
                break
            time.sleep(0.2)
        missing = [w for w in wanted if w not in samples]
        used = samples.get("nv_gpu_memory_used_bytes", 0.0)
        detail = f"missing {missing}" if missing else ", ".join(f"{k}={v:.4g}" for k, v in sorted(samples.items()))
        check("gpu-metrics", not missing and used > 0, detail, failed)


def table(rows: dict[str, dict[int, float | str]], batches: list[int], header: str) -> str:
    def cell(value: float | str) -> str:
        return value if isinstance(value, str) else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"

    head = "| model (instance) | " + " | ".join(f"batch {b}" for b in batches) + " |"
    lines = [header, "", head, "|" + "---|" * (len(batches) + 1)]
    for name, results in rows.items():
        kind, dtype = KINDS[name]
        cells = " | ".join(cell(results.get(b, "-")) for b in batches)
        lines.append(f"| {name} ({kind} {dtype}) | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kinds", default="gpu,gpu_fp16,cpu", help="models to serve: gpu, gpu_fp16, cpu")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--budget-s", type=float, default=150.0, help="cells that would end past it show '-'")
    parser.add_argument("--workdir", type=Path, default=None, help="repository and server log (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.kinds.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown or not names:
        parser.error(f"--kinds: unknown {unknown}; choose from {sorted(KINDS)}")
    if args.hidden % 64 or args.hidden <= 0 or args.layers <= 0:
        parser.error("--hidden must be a positive multiple of 64 (heads of 64) and --layers positive")
    batches = sorted({int(b) for b in args.batches.split(",")})
    if not batches or min(batches) < 1 or max(batches) > 64:
        parser.error("--batches: sizes from 1 to 64 (the models' max_batch_size)")
    deadline = time.monotonic() + args.budget_s
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-torch-"))
    repo = workdir / "models"
    write_repository(repo, names, args.layers, args.hidden)
    modelsvc = torch_server(repo, workdir / "server.log")
    modelsvc.start()
    failed: list[str] = []
    rows: dict[str, dict[int, float | str]] = {name: {} for name in names}
    try:
        started = time.monotonic()
        modelsvc.wait_ready()
        print(f"bench_torch: modelsvc ready in {time.monotonic() - started:.1f}s with {names}", flush=True)
        run_checks(modelsvc, names, args.tokens, failed)
        url = modelsvc.url
        for batch in batches:
            for name in names:
                served = Served(url, name, INPUTS, ["embeddings"])
                concurrency = concurrency_for(batch, 64)
                submit, close = served.submitter(batch, args.tokens, concurrency)
                try:
                    rows[name][batch] = measure_window(submit, batch, concurrency, args.seconds, deadline)
                except Exception as exc:  # a failing cell is shown in the table and the run goes on
                    rows[name][batch] = f"error: {type(exc).__name__}"
                    print(f"bench_torch: {name} batch {batch}: {exc}", file=sys.stderr)
                finally:
                    close()
                print(f"bench_torch: {name} batch {batch}: {rows[name][batch]}", flush=True)
    finally:
        modelsvc.close()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    header = (
        f"GPU: {gpu} | torch {torch.__version__} | encoder {args.layers} layers, hidden {args.hidden}, "
        f"{args.tokens} tokens | sequences/s over tritonclient HTTP, {args.seconds:g} s per cell"
    )
    text = table(rows, batches, header)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    errors = [f"{n}/{b}" for n, r in rows.items() for b, v in r.items() if isinstance(v, str) and v.startswith("error")]
    if errors:
        print(f"bench_torch: cells that failed: {errors}", file=sys.stderr)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
