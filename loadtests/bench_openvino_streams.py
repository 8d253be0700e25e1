"""One batch at a time or several overlapping on the openvino backend: `python -m loadtests.bench_openvino_streams`.

MiniLM's ONNX file (services/doc_classifier/model_repository/minilm/1/model.onnx, built by `python -m
services.build`) in process, through the backends' own instances: ONNX Runtime f32 (one session), OpenVINO with
its default hint (one stream, one InferRequest) and OpenVINO with NUM_STREAMS 2 (two InferRequests, each on its
own thread, as the scheduler's workers run them). The same batches go through each in interleaved rounds; wall
time (best and median of the rounds) and the process's CPU time per batch (median), which stays meaningful when
other jobs share the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from modelsvc.backends import ModelConfig, ModelInstance, get_backend

MODEL_DIR = Path(__file__).resolve().parents[1] / "services" / "doc_classifier" / "model_repository" / "minilm"
STREAMS2 = 'parameters { key: "NUM_STREAMS" value { string_value: "2" } }\n'


def _config(text: str) -> Any:
    return text_format.Parse(text, ModelConfig())


def instances(backend: str, extra: str) -> list[ModelInstance]:
    base = (MODEL_DIR / "config.pbtxt").read_text().split("# padding-aware")[0]
    config = _config(base.replace('backend: "onnxruntime"', f'backend: "{backend}"') + extra)
    config.default_model_filename = "model.onnx"
    return get_backend(config).create_instances(config, MODEL_DIR / "1" / "model.onnx", 1)


def run(created: list[ModelInstance], batches: list[dict[str, np.ndarray[Any, Any]]]) -> tuple[float, float]:
    """Every batch through ``created``, one worker thread per instance; (wall s, CPU s)."""
    work = list(batches)
    lock = threading.Lock()

    def worker(instance: ModelInstance) -> None:
        while True:
            with lock:
                if not work:
                    return
                batch = work.pop()
            instance.execute(batch, ["sentence_embedding"])

    cpu, start = sum(os.times()[:2]), time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in created]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, sum(os.times()[:2]) - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.tokens)
    batches = [
        {
            "input_ids": rng.integers(1000, 20000, shape).astype(np.int64),
            "attention_mask": np.ones(shape, np.int64),
            "token_type_ids": np.zeros(shape, np.int64),
        }
        for _ in range(args.batches)
    ]
    variants = {
        "onnxruntime f32, 1 session": instances("onnxruntime", ""),
        "openvino, 1 stream": instances("openvino", ""),
        "openvino, NUM_STREAMS 2": instances("openvino", STREAMS2),
    }
    for created in variants.values():
        for instance in created:
            instance.execute(batches[0], [])
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, created in variants.items():
            results[name].append(run(created, batches))
    load = os.getloadavg()[0]
    print(f"{args.batches} batches of {args.batch} x {args.tokens}, {args.rounds} rounds, load average {load:.1f}")
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        cpu = statistics.median(c for _, c in runs) / args.batches
        print(
            f"{name:28s} instances {len(variants[name])}: wall best {min(walls):.2f} s, median "
            f"{statistics.median(walls):.2f} s; CPU per batch {cpu * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
