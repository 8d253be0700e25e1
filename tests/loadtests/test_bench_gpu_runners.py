"""bench_gpu's runners without a GPU (shared/reviews/gpu-code.md, B3 and B4): a runner that cannot start fills its
own column with its error and the next runner still runs; TensorRT and ONNX Runtime ask for the same outputs; the
ONNX Runtime session preloads the CUDA libraries first and falls back to fp32 where the fp16 session fails."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest

from loadtests.gpu import _ort_cuda
from loadtests.gpu import bench_gpu as bench
from modelsvc.tools import onnx_models as om


@pytest.fixture
def spec(tmp_path: Path) -> bench.ModelSpec:
    om.write_model(tmp_path, "tok", om.token_classifier(), None)
    onnx = tmp_path / "tok" / "1" / "model.onnx"
    return bench.ModelSpec("tok", 2, 64, onnx, tmp_path / "tok.plan", "tok")


ARGS = argparse.Namespace(tokens=(8,), batches=(1, 2), peak=None, url="")


class FakeEngine:
    def __init__(self, plan: Path) -> None:
        self.asked: list[list[str]] = []
        self.closed = False

    def infer(self, feeds: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        self.asked.append(list(outputs))
        return {name: np.zeros(1) for name in outputs}

    def close(self) -> None:
        self.closed = True


def test_an_ort_session_that_fails_leaves_the_tensorrt_column(spec: bench.ModelSpec) -> None:
    engines: list[FakeEngine] = []

    def engine(plan: Path) -> FakeEngine:
        engines.append(FakeEngine(plan))
        return engines[-1]

    def no_cuda(onnx: Path) -> tuple[Any, str]:
        raise RuntimeError("ONNX Runtime runs it on ['CPUExecutionProvider'] (no CUDAExecutionProvider)")

    rows, _ = bench.run_model(spec, ARGS, 0.02, time.monotonic() + 30, engine_factory=engine, session_factory=no_cuda)
    assert [(r.batch, r.tokens) for r in rows] == [(1, 8), (2, 8)]
    assert all(isinstance(r.results["tensorrt"], float) for r in rows)
    assert [r.results["ort_cuda"] for r in rows] == ["error: RuntimeError"] * 2
    assert engines[0].closed
    assert {tuple(a) for a in engines[0].asked} == {("logits",)}  # the outputs asked for, not every one
    table = bench.format_table(rows, gpu="NVIDIA H100 80GB HBM3", peak_tflops=None, ort_precision="fp16")
    assert "error: RuntimeError" in table


def test_an_engine_that_fails_leaves_the_ort_column(spec: bench.ModelSpec) -> None:
    asked: list[list[str]] = []

    class Session:
        def run(self, outputs: list[str], feeds: dict[str, Any]) -> list[Any]:
            asked.append(list(outputs))
            return [np.zeros(1)]

    def no_plan(plan: Path) -> Any:
        raise RuntimeError("CUDA error cudaErrorNoDevice")

    rows, precision = bench.run_model(
        spec, ARGS, 0.02, time.monotonic() + 30, engine_factory=no_plan, session_factory=lambda p: (Session(), "fp32")
    )
    assert [r.results["tensorrt"] for r in rows] == ["error: RuntimeError"] * 2
    assert all(isinstance(r.results["ort_cuda"], float) for r in rows)
    assert precision == "fp32"
    assert {tuple(a) for a in asked} == {("logits",)}


def test_onnx_io_reads_the_graph(spec: bench.ModelSpec) -> None:
    inputs, outputs = _ort_cuda.onnx_io(spec.onnx)
    assert inputs == {"input_ids": np.int64, "attention_mask": np.int64}
    assert outputs == ["logits"]


def test_the_fp16_session_falls_back_to_fp32_after_preloading(
    spec: bench.ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    class Session:
        def __init__(self, model: Any, options: Any, providers: Any) -> None:
            if isinstance(model, bytes):  # the converted fp16 graph
                events.append("fp16 session")
                raise RuntimeError("Type Error: Type (tensor(float16)) of input parameter of Cast is invalid")
            events.append("fp32 session")

        def get_providers(self) -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    monkeypatch.setattr(_ort_cuda, "_preloaded", [])
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: events.append("preload"), raising=False)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPU"])
    monkeypatch.setattr(onnxruntime, "InferenceSession", Session)
    session, precision = _ort_cuda.ort_cuda_session(spec.onnx)
    assert precision == "fp32"
    assert isinstance(session, Session)
    assert events == ["preload", "fp16 session", "fp32 session"]
    _ort_cuda.ort_cuda_session(spec.onnx)
    assert events.count("preload") == 1
