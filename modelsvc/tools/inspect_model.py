"""What a model file takes and gives (``modelsvc inspect``): tensors, datatypes, dims, opsets.

``inspect_model(path)`` reads an ONNX model (``.onnx``, or any file that parses as one), a TensorRT
engine (``.plan`` / ``.engine``, where the ``tensorrt`` package is installed), a TorchScript model (``.pt``,
where PyTorch is) or an OpenVINO IR (``.xml`` with its ``.bin``, where OpenVINO is; ``_inspect_formats``)
and returns a ``ModelInfo``;
``render_text`` and ``to_json`` turn it into a table for people or a dict for scripts. Nothing here runs
the model. Datatypes are the model configuration's names (``TYPE_INT64``, ``TYPE_FP32``), so what is shown
can go straight into a ``config.pbtxt``; a dynamic dim is ``-1``, with its symbolic name where the file
gives one.

An ONNX file is read without its external data: the tensors' sizes come from their declared shapes, so a
model of several gigabytes is inspected in the time it takes to read its graph.

Errors: ``InspectError`` (missing file, a file that is not a model, the package that reads it not installed).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import onnx
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from onnx import TensorProto

from modelsvc.protocol import ONNX_TO_CONFIG

from ._inspect_types import InspectError, ModelInfo, TensorInfo

__all__ = [
    "InspectError",
    "ModelInfo",
    "TensorInfo",
    "format_dims",
    "inspect_model",
    "onnx_tensors",
    "render_text",
    "to_json",
]

# TensorRT's DataType member names -> model configuration datatype names
_TRT_TO_CONFIG: dict[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "HALF": "TYPE_FP16",
    "FLOAT": "TYPE_FP32",
    "BF16": "TYPE_BF16",
}

_TENSORRT_SUFFIXES = (".plan", ".engine")
_DEFAULT_DOMAIN = "ai.onnx"


def inspect_model(path: Path | str) -> ModelInfo:
    """Read the model file at ``path``: ONNX, or a TensorRT engine for a ``.plan``/``.engine`` suffix."""
    path = Path(path)
    if not path.exists():
        raise InspectError(f"{path}: no such file")
    if path.is_dir():
        raise InspectError(f"{path} is a directory; give the model file (e.g. {path}/1/model.onnx)")
    suffix = path.suffix.lower()
    if suffix in _TENSORRT_SUFFIXES:
        return _inspect_tensorrt(path)
    if suffix in (".pt", ".pth", ".xml"):
        from ._inspect_formats import inspect_openvino, inspect_torchscript

        return inspect_openvino(path) if suffix == ".xml" else inspect_torchscript(path)
    return _inspect_onnx(path)


# --- ONNX --------------------------------------------------------------------------------------------


def _inspect_onnx(path: Path) -> ModelInfo:
    try:
        model = onnx.load(str(path), load_external_data=False)
    # onnx.load parses .pbtxt/.json files as protobuf text or JSON: their parse errors mean the same
    except (DecodeError, text_format.Error, json_format.Error, RuntimeWarning, ValueError) as exc:
        raise InspectError(f"{path} is not an ONNX model: {exc}") from None
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc}") from None
    # protobuf parses many byte strings without complaint; a model has an IR version, an opset and a graph
    if model.ir_version <= 0 or not model.opset_import or not (model.graph.node or model.graph.output):
        raise InspectError(f"{path} is not an ONNX model (no IR version, opset or graph in it)")
    inputs, outputs = onnx_tensors(model)
    count = nbytes = 0
    external: set[str] = set()
    for tensor in _all_initializers(model.graph):
        elements = math.prod(tensor.dims)
        count += elements
        nbytes += elements * _element_size(tensor.data_type)
        for entry in tensor.external_data:
            if entry.key == "location":
                external.add(entry.value)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p) or None
    return ModelInfo(
        path=path,
        format="onnx",
        inputs=inputs,
        outputs=outputs,
        opsets={op.domain or _DEFAULT_DOMAIN: op.version for op in model.opset_import},
        ir_version=model.ir_version,
        producer=producer,
        graph_name=model.graph.name or None,
        parameter_count=count,
        parameter_bytes=nbytes,
        external_data=tuple(sorted(external)),
        file_bytes=path.stat().st_size,
    )


def onnx_tensors(model: onnx.ModelProto) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """The graph's inputs (without initializers listed as inputs, as older IR versions do) and outputs."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = tuple(_tensor(v) for v in model.graph.input if v.name not in initializers)
    return inputs, tuple(_tensor(v) for v in model.graph.output)


def _tensor(value: onnx.ValueInfoProto) -> TensorInfo:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return TensorInfo(value.name, kind or "unknown", ())
    tensor_type = value.type.tensor_type
    elem = tensor_type.elem_type
    onnx_type = f"tensor({TensorProto.DataType.Name(elem).lower()})"  # as ONNX Runtime spells it
    datatype = ONNX_TO_CONFIG.get(onnx_type, onnx_type)
    dims: list[int] = []
    names: list[str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
            names.append(None)
        else:
            dims.append(-1)
            names.append(dim.dim_param or None)
    return TensorInfo(value.name, datatype, tuple(dims), tuple(names))


def _all_initializers(graph: onnx.GraphProto) -> Iterable[TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
    for node in graph.node:  # weights kept in Constant nodes, and those of control-flow subgraphs
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and node.op_type == "Constant":
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_initializers(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _all_initializers(sub)


def _element_size(data_type: int) -> int:
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except (KeyError, TypeError, ValueError):
        return 0


# --- TensorRT ----------------------------------------------------------------------------------------


def _inspect_tensorrt(path: Path) -> ModelInfo:
    try:
        trt: Any = importlib.import_module("tensorrt")
    except ImportError:
        raise InspectError(
            f"{path} is a TensorRT engine; reading it needs TensorRT: pip install 'modelsvc[tensorrt]' "
            "(from NVIDIA's package index, on a machine with a GPU)"
        ) from None
    logger = trt.Logger(trt.Logger.ERROR)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise InspectError(
            f"{path} is not a TensorRT engine this TensorRT ({trt.__version__}) can read "
            "(engines are tied to the TensorRT version and GPU that built them)"
        )
    inputs: list[TensorInfo] = []
    outputs: list[TensorInfo] = []
    input_names: list[str] = []
    for index in range(engine.num_io_tensors):
        name = str(engine.get_tensor_name(index))
        dtype = engine.get_tensor_dtype(name)
        datatype = _TRT_TO_CONFIG.get(dtype.name, f"trt.{dtype.name}")
        dims = tuple(int(d) for d in engine.get_tensor_shape(name))
        info = TensorInfo(name, datatype, dims, (None,) * len(dims))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs.append(info)
            input_names.append(name)
        else:
            outputs.append(info)
    profiles: list[dict[str, tuple[tuple[int, ...], ...]]] = []
    for profile in range(engine.num_optimization_profiles):
        shapes: dict[str, tuple[tuple[int, ...], ...]] = {}
        for name in input_names:
            min_opt_max = engine.get_tensor_profile_shape(name, profile)
            shapes[name] = tuple(tuple(int(d) for d in shape) for shape in min_opt_max)
        profiles.append(shapes)
    return ModelInfo(
        path=path,
        format="tensorrt",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        producer=f"TensorRT {trt.__version__}",
        profiles=tuple(profiles),
        file_bytes=path.stat().st_size,
    )


# --- rendering ---------------------------------------------------------------------------------------


def format_dims(tensor: TensorInfo) -> str:
    """``[-1 (batch), -1 (sequence), 384]``: dynamic dims with their symbolic names where known."""
    if not tensor.dims and tensor.datatype == "unknown":
        return "unknown"
    parts = [str(d) if name is None else f"{d} ({name})" for d, name in zip(tensor.dims, tensor.names(), strict=True)]
    return f"[{', '.join(parts)}]"


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _count(n: int) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.2f}{suffix} ({n:,})"
    return str(n)


def _table(title: str, tensors: Iterable[TensorInfo]) -> list[str]:
    rows = [(t.name, t.datatype, format_dims(t)) for t in tensors]
    if not rows:
        return [f"{title}: none"]
    widths = [max(len(header), *(len(r[i]) for r in rows)) for i, header in enumerate(("name", "datatype"))]
    lines = [f"{title}:", f"  {'name':<{widths[0]}}  {'datatype':<{widths[1]}}  dims"]
    lines += [f"  {n:<{widths[0]}}  {d:<{widths[1]}}  {dims}" for n, d, dims in rows]
    return lines


def render_text(info: ModelInfo) -> str:
    """A readable report: the tensors as a table, then what the file says about itself."""
    kinds = {
        "onnx": "ONNX model",
        "tensorrt": "TensorRT engine",
        "torchscript": "TorchScript",
        "openvino": "OpenVINO IR",
    }
    kind = kinds.get(info.format, info.format)
    lines = [f"{info.path} ({kind}, {_size(info.file_bytes)})"]
    lines += _table("inputs", info.inputs)
    lines += _table("outputs", info.outputs)
    if info.opsets:
        lines.append("opsets: " + ", ".join(f"{domain} {version}" for domain, version in sorted(info.opsets.items())))
    if info.ir_version is not None:
        lines.append(f"IR version: {info.ir_version}")
    if info.producer:
        lines.append(f"producer: {info.producer}")
    if info.graph_name:
        lines.append(f"graph: {info.graph_name}")
    if info.format != "tensorrt":
        lines.append(f"parameters: {_count(info.parameter_count)}, {_size(info.parameter_bytes)}")
    if info.external_data:
        lines.append("external data: " + ", ".join(info.external_data))
    lines += [f"note: {note}" for note in info.notes]
    for index, profile in enumerate(info.profiles):
        lines.append(f"profile {index}:")
        for name, (low, opt, high) in profile.items():
            lines.append(f"  {name}: min {list(low)} opt {list(opt)} max {list(high)}")
    return "\n".join(lines) + "\n"


def _tensor_json(tensor: TensorInfo) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "dims": list(tensor.dims),
        "dim_names": list(tensor.names()),
    }


def to_json(info: ModelInfo) -> dict[str, Any]:
    """The report as plain JSON types (``modelsvc inspect --json``)."""
    return {
        "path": str(info.path),
        "format": info.format,
        "file_bytes": info.file_bytes,
        "inputs": [_tensor_json(t) for t in info.inputs],
        "outputs": [_tensor_json(t) for t in info.outputs],
        "opsets": dict(sorted(info.opsets.items())),
        "ir_version": info.ir_version,
        "producer": info.producer,
        "graph_name": info.graph_name,
        "parameter_count": info.parameter_count,
        "parameter_bytes": info.parameter_bytes,
        "external_data": list(info.external_data),
        "notes": list(info.notes),
        "profiles": [
            {name: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for name, s in p.items()}
            for p in info.profiles
        ],
    }
