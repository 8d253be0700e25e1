"""Precision by conversion: what ``--fp16``, ``--bf16`` and ``--int8`` mean on strongly typed networks.

TensorRT 11 builds strongly typed networks only (its FP16, BF16 and INT8 builder flags and the INT8 calibrator
are gone), and ``modelsvc build`` builds them on TensorRT 10 too: every tensor has the type the ONNX model gives
it. So a precision is a property of the model, set before TensorRT parses it:

- ``--fp16`` converts the model with ONNX Runtime's float16 converter (``onnxruntime.transformers``: ``OnnxModel``'s
  ``convert_float_to_float16`` and ``topological_sort``; the converter is the maintained fork of
  onnxconverter-common's, which also retypes the exporter's ``Cast(to=float)`` nodes, where onnxconverter-common's
  leaves them and ONNX Runtime then refuses the model; it comes with onnxruntime, a base dependency);
- ``--bf16`` converts it with NVIDIA ModelOpt's AutoCast (``modelopt.onnx.autocast``), the one kept converter that
  writes bf16 (``pip install 'modelsvc[autocast]'``; it imports torch);
- both keep the model's input and output types and keep in fp32 the operators of :data:`FP32_OPS`
  (normalizations, softmax, reductions, and the Pow/Sqrt of a decomposed LayerNorm or L2 norm), with Cast nodes
  at the borders; AutoCast may keep more (nodes whose values exceed bf16's useful range on its reference run);
- ``--int8`` means an explicitly quantized model (QuantizeLinear/DequantizeLinear nodes, e.g. from ONNX Runtime's
  ``quantize_static`` in the QDQ format or ModelOpt's ONNX quantization), built as it is. Only TensorRT 10 can
  still calibrate a model without Q/DQ (``--calib-npz``/``--calib``, a weakly typed network): :func:`int8_mode`.

The converted model is written to a temporary folder that ``build_plan`` removes after the build (never beside
the plan: the plan is checked against ONNX Runtime on the original fp32 model, and only the plan is kept). The
report lists the nodes that stayed fp32 (:attr:`Conversion.kept_fp32`).
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import BuildUsageError

__all__ = [
    "AUTOCAST_EXTRA",
    "FP32_OPS",
    "QDQ_OPS",
    "Conversion",
    "convert",
    "int8_mode",
    "is_quantized",
    "refuse_calibration",
]

#: how to install ModelOpt's AutoCast for --bf16 (its own [onnx] extra pins a CUDA 12 onnxruntime-gpu: not that)
AUTOCAST_EXTRA = "pip install 'modelsvc[autocast]'"
#: operator types kept in fp32 by --fp16 and --bf16: normalizations, softmax and the reductions
FP32_OPS = (
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "Softmax",
    "LogSoftmax",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
    "Pow",
    "Sqrt",
)
#: the operators of an explicitly quantized model
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: protobuf's 2 GiB limit for one serialized model, less a margin: larger converted models get external data
_EXTERNAL_DATA_BYTES = 1_800_000_000
_FLOAT = 1  # onnx.TensorProto.FLOAT
_NOT_COUNTED = ("Cast", "Constant", "CastLike")


@dataclass(frozen=True)
class Conversion:
    """A model converted to fp16 or bf16 for a strongly typed build."""

    precision: str
    #: the converter and its version, e.g. ``ONNX Runtime 1.31.1 float16``
    converter: str
    #: the converted model (in the build's temporary folder)
    path: Path
    #: the nodes whose outputs stayed fp32, as ``(op_type, name)`` (Cast and Constant nodes not counted)
    kept_fp32: tuple[tuple[str, str], ...]

    def kept_by_op(self) -> dict[str, int]:
        """How many nodes of each operator type stayed fp32, most first."""
        return dict(Counter(op for op, _name in self.kept_fp32).most_common())

    def describe(self) -> str:
        kept = ", ".join(f"{op} x{n}" for op, n in self.kept_by_op().items()) or "none"
        return f"converted to {self.precision} by {self.converter} before parsing; kept in fp32: {kept}"


def is_quantized(model: Any) -> bool:
    """Whether an ONNX model is explicitly quantized: it has QuantizeLinear or DequantizeLinear nodes."""
    return any(node.op_type in QDQ_OPS for node in model.graph.node)


def int8_mode(*, quantized: bool, calibration: bool, onnx_path: Path) -> str:
    """What --int8 builds, before TensorRT is imported: ``"qdq"`` (a Q/DQ model as it is) or ``"calibrate"``
    (TensorRT 10's calibrator; the caller checks that this TensorRT has one). BuildUsageError where neither fits."""
    if quantized and calibration:
        raise BuildUsageError(
            f"--int8: {onnx_path} is already quantized (QuantizeLinear/DequantizeLinear nodes), so --calib and "
            "--calib-npz do not apply: build it with --int8 alone"
        )
    if quantized:
        return "qdq"
    if calibration:
        return "calibrate"
    raise BuildUsageError(
        f"--int8 builds an explicitly quantized model and {onnx_path} has no QuantizeLinear/DequantizeLinear "
        "nodes: quantize it first (ONNX Runtime's quantize_static with quant_format=QuantFormat.QDQ, or ModelOpt's "
        "`python -m modelopt.onnx.quantization`), or, with TensorRT 10 only, calibrate: --calib-npz FILE (real "
        "inputs) or --calib CACHE of an earlier run"
    )


def refuse_calibration(tensorrt_version: str) -> BuildUsageError:
    """The error for calibration flags on a TensorRT without the INT8 calibrator (11 and later)."""
    return BuildUsageError(
        f"--int8 with --calib/--calib-npz: TensorRT {tensorrt_version} has no INT8 calibrator (TensorRT 11 removed "
        "it and builds strongly typed networks only): quantize the ONNX model to Q/DQ first (ONNX Runtime's "
        "quantize_static with quant_format=QuantFormat.QDQ and your calibration data, or ModelOpt's "
        "`python -m modelopt.onnx.quantization`) and build it with --int8 alone, or calibrate with TensorRT 10"
    )


def _fp16(model: Any) -> tuple[Any, str]:
    try:
        import onnxruntime
        from onnxruntime.transformers import float16
        from onnxruntime.transformers.onnx_model import OnnxModel
    except ImportError as exc:
        raise BuildUsageError(
            f"--fp16 converts the model with ONNX Runtime's float16 converter, which cannot be imported ({exc}): "
            "pip install 'modelsvc[tensorrt]'"
        ) from None
    # OnnxModel's conversion is the one ONNX Runtime's transformer optimizer runs: the float16 converter, then
    # cascaded and useless Casts removed; the converter appends the Casts it inserts at the end of the graph, and
    # TensorRT's parser (and onnx's inference) read nodes in order, hence the topological sort
    wrapped = OnnxModel(model)
    block = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(FP32_OPS))
    wrapped.convert_float_to_float16(use_symbolic_shape_infer=False, keep_io_types=True, op_block_list=block)
    wrapped.topological_sort(is_deterministic=True)
    return wrapped.model, f"ONNX Runtime {onnxruntime.__version__} float16"


def _bf16(source: Path) -> tuple[Any, str]:
    try:
        autocast = importlib.import_module("modelopt.onnx.autocast")
    except ImportError as exc:
        raise BuildUsageError(
            f"--bf16 converts the model with NVIDIA ModelOpt's AutoCast, which cannot be imported ({exc}): "
            f"{AUTOCAST_EXTRA} (ONNX Runtime's converter writes fp16 only)"
        ) from None
    converted = autocast.convert_to_mixed_precision(
        onnx_path=str(source), low_precision_type="bf16", keep_io_types=True, op_types_to_exclude=list(FP32_OPS)
    )
    version = getattr(importlib.import_module("modelopt"), "__version__", "?")
    return converted, f"ModelOpt {version} AutoCast"


def _retyped(onnx: Any, model: Any) -> Any:
    """The model with its intermediate value_info inferred anew: the converters leave some stale entries (a type
    the converted graph no longer has), which a strict reader refuses."""
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def _kept_fp32(model: Any) -> list[tuple[str, str]]:
    types = {info.name: info.type.tensor_type.elem_type for info in model.graph.value_info}
    types.update({info.name: info.type.tensor_type.elem_type for info in model.graph.output})
    return [
        (node.op_type, node.name)
        for node in model.graph.node
        if node.op_type not in _NOT_COUNTED and any(types.get(name) == _FLOAT for name in node.output if name)
    ]


def convert(source: Path, precision: str, folder: Path) -> Conversion:
    """Convert ``source`` to ``precision`` (fp16 or bf16) into ``folder`` (see the module's docstring)."""
    import onnx

    if precision == "fp16":
        converted, converter = _fp16(onnx.load(str(source)))
    elif precision == "bf16":
        converted, converter = _bf16(source)
    else:
        raise ValueError(f"no conversion for {precision!r}")
    large = converted.ByteSize() > _EXTERNAL_DATA_BYTES
    if not large:  # onnx's in-memory inference stops at 2 GiB; a larger model keeps the converter's value_info
        converted = _retyped(onnx, converted)
    path = folder / f"{source.stem}.{precision}.onnx"
    onnx.save_model(converted, str(path), save_as_external_data=large, location=f"{path.name}.data")
    return Conversion(precision, converter, path, tuple(_kept_fp32(converted)))
