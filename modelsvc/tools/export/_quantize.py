"""Calibrated int8 (``--precision int8 --calibration``): weights and activations quantized, ranges measured on text.

Weight-only int8 (NNCF's ``compress_weights``) and ONNX Runtime's dynamic quantization leave the activations in
float, or quantize them per call, so the integer dot products of VNNI and AMX-INT8 do little. Here every weighted
MatMul but the ones kept in float gets int8 inputs whose ranges come from the calibration windows (``_calibrate``):

- openvino: NNCF's post-training quantization (``nncf.quantize``) of the IR, as a transformer
  (``ModelType.TRANSFORMER``: SmoothQuant moves the activations' outlier channels into the weights first, and the
  attention's own products stay float), FakeQuantize nodes that the CPU plugin runs as int8;
- onnx: ONNX Runtime's static quantization (``quantize_static``) of the unfused graph to QuantizeLinear /
  DequantizeLinear pairs (QDQ; int8 weights per channel, uint8 activations), preceded by the same smoothing done
  here (``_smooth``): ONNX Runtime's own SmoothQuant needs Intel Neural Compressor, and NNCF's ONNX backend does
  not import with this ONNX.

Kept in float, in both: the feed-forward blocks' second MatMul (the one fed by the GELU, found by the graph's
shape, not by name), whose input is the widest-ranging activation of a BERT layer (GELU's long positive tail over
1,536 channels in MiniLM). Quantized, it costs MiniLM most of its cosine (OpenVINO: 0.9932 with it, 0.9975 kept, the
smallest cosine of the pooled output with fp32 over held-out windows of text up to 512 tokens). The attention's own
products (query by key, weights by value) are not weighted MatMuls and stay float too. On ONNX the smoothing matters
as much: 0.9932 without it, 0.9986 with it (the same windows).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ._errors import ExportError, ExportUsageError, first_line
from ._inputs import Feeds
from ._onnx import quiet

__all__ = ["FLOAT_KEPT", "float_kept_onnx", "float_kept_openvino", "onnx_int8_static", "openvino_int8_static"]

#: what stays float, in words (the report and the logs say it)
FLOAT_KEPT = "the feed-forward blocks' second MatMul (fed by the GELU)"

_ACTIVATIONS = frozenset({"Gelu", "Erf", "Tanh", "Relu", "Sigmoid", "Swish", "HSwish", "Mish"})
#: elementwise operations an activation reaches a MatMul through (its GELU written out, a bias, a cast)
_ELEMENTWISE = frozenset({"Add", "Mul", "Multiply", "Div", "Divide", "Sub", "Subtract", "Pow", "Power", "Sqrt",
                          "Cast", "Convert", *_ACTIVATIONS})  # fmt: skip


def _fed_by_activation(producer: Any, inputs_of: Callable[[Any], Sequence[Any]], kind: Callable[[Any], str]) -> bool:
    """Whether ``producer`` is an activation function, or reaches one through elementwise operations only."""
    seen: set[int] = set()
    todo = [producer]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        op = kind(node)
        if op in _ACTIVATIONS:
            return True
        if op in _ELEMENTWISE and len(seen) < 16:
            todo.extend(inputs_of(node))
    return False


def float_kept_openvino(model: Any) -> list[str]:
    """The friendly names of the IR's MatMuls kept in float: weighted (a constant, or a converted constant, second
    input) and fed by an activation function."""
    def producer(node: Any, index: int) -> Any:
        return node.input(index).get_source_output().get_node()

    def inputs_of(node: Any) -> list[Any]:
        return [producer(node, i) for i in range(node.get_input_size())]

    def kind(node: Any) -> str:
        return str(node.get_type_name())

    names = []
    for op in model.get_ordered_ops():
        if kind(op) != "MatMul":
            continue
        weight = producer(op, 1)
        while kind(weight) in ("Convert", "Transpose", "Reshape") and kind(producer(weight, 0)) != "Parameter":
            weight = producer(weight, 0)
        if kind(weight) == "Constant" and _fed_by_activation(producer(op, 0), inputs_of, kind):
            names.append(str(op.get_friendly_name()))
    return names


def float_kept_onnx(model: Any) -> list[str]:
    """The names of the ONNX graph's MatMuls kept in float: weighted (an initializer second input) and fed by an
    activation function."""
    made_by = {out: node for node in model.graph.node for out in node.output}
    weights = {init.name for init in model.graph.initializer}

    def inputs_of(node: Any) -> list[Any]:
        return [made_by.get(name) for name in node.input]

    def kind(node: Any) -> str:
        return str(node.op_type)

    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and node.input[1] in weights
        and _fed_by_activation(made_by.get(node.input[0]), inputs_of, kind)
    ]  # fmt: skip


def _import(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ExportUsageError(
            f"--precision int8 --calibration needs {module} ({first_line(exc)}): pip install 'modelsvc[{extra}]'"
        ) from None


def openvino_int8_static(ov: Any, model: Any, windows: Sequence[Feeds], log: Callable[[str], None]) -> Any:
    """The IR ``model`` quantized by NNCF on ``windows``, FLOAT_KEPT left in float."""
    nncf = _import("nncf", "openvino")
    kept = float_kept_openvino(model)
    log(f"calibrating on {len(windows)} windows of text; kept in float: {len(kept)} MatMuls, {FLOAT_KEPT}")
    try:
        with quiet("nncf", "root", "onnxruntime"):
            return nncf.quantize(
                model,
                nncf.Dataset(list(windows)),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(windows),
                ignored_scope=nncf.IgnoredScope(names=kept),
            )
    except Exception as exc:  # NNCF raises its own kinds, and OpenVINO's come through it
        raise ExportError(f"nncf.quantize could not quantize the model: {first_line(exc)}") from exc


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol over the windows (get_next until None)."""

    def __init__(self, windows: Sequence[Feeds]) -> None:
        self._windows: Iterator[Feeds] = iter(windows)

    def get_next(self) -> Feeds | None:
        return next(self._windows, None)

    def rewind(self) -> None:  # not used by MinMax calibration, part of the protocol
        raise NotImplementedError


def onnx_int8_static(source: Path, target: Path, windows: Sequence[Feeds], log: Callable[[str], None]) -> None:
    """``source`` (the unfused ONNX graph) smoothed and statically quantized to QDQ at ``target``."""
    onnx = importlib.import_module("onnx")
    quantization = _import("onnxruntime.quantization", "export")
    from ._smooth import smooth

    model = onnx.load(str(source))
    kept = float_kept_onnx(model)
    weights = {init.name for init in model.graph.initializer}
    # by name: QDQ quantization would take the attention's own MatMuls too (MatMulConstBOnly is QOperator's only)
    chosen = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    chosen = [name for name in chosen if name not in kept]
    smoothed = smooth(model, windows, skip=set(kept))
    log(f"calibrating on {len(windows)} windows of text; smoothed {smoothed} MatMul inputs; kept in float: "
        f"{len(kept)} MatMuls, {FLOAT_KEPT}")  # fmt: skip
    prepared = target.with_name("smoothed.onnx")
    onnx.save(model, str(prepared))
    try:
        with quiet("nncf", "root", "onnxruntime"):
            quantization.quantize_static(
                str(prepared),
                str(target),
                _Reader(windows),
                quant_format=quantization.QuantFormat.QDQ,
                per_channel=True,
                activation_type=quantization.QuantType.QUInt8,
                weight_type=quantization.QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=chosen,
                nodes_to_exclude=kept,
                calibrate_method=quantization.CalibrationMethod.MinMax,
                # the MatMuls' outputs stay float (QDQ would quantize them for the bias Add), and a tensor read by a
                # MatMul and by the residual Add gets its own Q/DQ pair for the MatMul, the Add reading the float one
                extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"], "DedicatedQDQPair": True},
            )
    except Exception as exc:  # ONNX Runtime's quantizer raises many kinds
        raise ExportError(f"onnxruntime's quantize_static could not quantize the model: {first_line(exc)}") from exc
    finally:
        prepared.unlink(missing_ok=True)
