"""bench_gpu's ONNX Runtime side: the CUDA session (fp16 where the conversion loads, else fp32) and the ONNX file's
inputs and outputs read without a session, so that the other columns run where ONNX Runtime's CUDA does not."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CUDA = "CUDAExecutionProvider"
_preloaded: list[bool] = []


def onnx_io(onnx_path: Path) -> tuple[dict[str, Any], list[str]]:
    """The model's inputs (name -> numpy dtype) and output names, from the ONNX graph (no weights are read)."""
    import numpy as np
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    kinds: dict[int, Any] = {
        onnx.TensorProto.INT64: np.int64,
        onnx.TensorProto.INT32: np.int32,
        onnx.TensorProto.FLOAT: np.float32,
    }
    inputs = {
        i.name: kinds.get(i.type.tensor_type.elem_type, np.int64)
        for i in model.graph.input
        if i.name not in initializers
    }
    return inputs, [o.name for o in model.graph.output]


def preload_cuda_libraries(ort: Any) -> None:
    """``onnxruntime.preload_dlls()`` (ORT 1.21+), once, before the first CUDA session: in a pip-only environment
    the CUDA and cuDNN libraries are nvidia-* wheels, which the provider does not find by itself."""
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded.append(True)
    try:
        ort.preload_dlls()
    except Exception as exc:  # the session below says which provider it got
        print(f"bench_gpu: onnxruntime.preload_dlls() failed: {exc}", file=sys.stderr)


def ort_cuda_session(onnx_path: Path) -> tuple[Any, str]:
    """An fp16 (else fp32) ONNX Runtime session on CUDAExecutionProvider; raises when CUDA is not what runs it.
    The fp16 graph falls back to fp32 where its conversion or its session fails (a converted graph that does not
    load: typed Cast, Range or ConstantOfShape inputs are the usual trouble)."""
    import onnxruntime as ort

    preload_cuda_libraries(ort)
    if CUDA not in ort.get_available_providers():  # the CPU build: ORT would warn, then fall back
        raise RuntimeError(
            f"ONNX Runtime {ort.__version__} has {ort.get_available_providers()} (no CUDAExecutionProvider): its CUDA "
            "libraries did not load, or this is the CPU build; install onnxruntime-gpu with the CUDA and cuDNN its "
            "release needs"
        )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = [(CUDA, {"device_id": 0}), "CPUExecutionProvider"]
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(onnx_path)), keep_io_types=True).SerializeToString()
        session, precision = ort.InferenceSession(model, options, providers=providers), "fp16"
    except Exception as exc:  # the fp32 graph still measures ONNX Runtime on CUDA; the header says fp32
        print(f"bench_gpu: {onnx_path}: no fp16 session ({exc}); ONNX Runtime runs it in fp32", file=sys.stderr)
        session, precision = ort.InferenceSession(str(onnx_path), options, providers=providers), "fp32"
    if session.get_providers()[0] != CUDA:
        raise RuntimeError(
            f"ONNX Runtime runs {onnx_path} on {session.get_providers()} (no CUDAExecutionProvider): its CUDA "
            "libraries did not load; install onnxruntime-gpu with the CUDA and cuDNN its release needs"
        )
    return session, precision
