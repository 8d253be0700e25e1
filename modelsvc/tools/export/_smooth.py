"""Smoothing before ONNX Runtime's static quantization (SmoothQuant's idea, done here on the ONNX graph).

A transformer's activations have a few channels whose values are tens of times larger than the rest; one int8
range per tensor then leaves the other channels a handful of steps. Dividing each input channel ``j`` of a
weighted MatMul by ``s_j`` and multiplying the weight's row ``j`` by it leaves the product unchanged and moves the
spread into the weights, which are quantized per output channel and take it better:

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

``max|X_j|`` is measured on the calibration windows (the graph run by ONNX Runtime with the MatMuls' inputs as
extra outputs), ``max|W_j|`` over every MatMul that reads the same input (a layer's query, key and value read one).
The division is a ``Mul`` by ``1 / s`` inserted before those MatMuls only: the same tensor also feeds the residual
branch, which must stay as it was, so it cannot be folded into the LayerNormalization before it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._inputs import Feeds

__all__ = ["ALPHA", "smooth"]

#: how much of the activations' spread moves into the weights (SmoothQuant's alpha)
ALPHA = 0.5
#: windows the activations' channel maxima are measured on
_MEASURED = 64


def smooth(model: Any, windows: Sequence[Feeds], skip: set[str], alpha: float = ALPHA) -> int:
    """Smooth, in place, the input of every weighted MatMul of ``model`` not named in ``skip``; the number of
    inputs smoothed."""
    onnx = importlib.import_module("onnx")
    numpy_helper = importlib.import_module("onnx.numpy_helper")
    weights = {init.name: init for init in model.graph.initializer}
    groups: dict[str, list[Any]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights and node.name not in skip:
            array = numpy_helper.to_array(weights[node.input[1]])
            if array.ndim == 2:
                groups.setdefault(node.input[0], []).append(node)
    if not groups:
        return 0
    maxima = _channel_maxima(model, list(groups), windows)
    for index, (tensor, nodes) in enumerate(groups.items()):
        arrays = [numpy_helper.to_array(weights[n.input[1]]).astype(np.float32) for n in nodes]
        w_max = np.max([np.abs(a).max(axis=1) for a in arrays], axis=0)
        x_max = maxima[tensor]
        scale = np.power(np.maximum(x_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
        scale = np.clip(scale, 1e-3, 1e3).astype(np.float32)
        for node, array in zip(nodes, arrays, strict=True):
            scaled = numpy_helper.from_array(array * scale[:, None], f"{node.input[1]}_smoothed")
            model.graph.initializer.append(scaled)
            node.input[1] = scaled.name
        divisor = numpy_helper.from_array((1.0 / scale).astype(np.float32), f"smooth_{index}_scale")
        model.graph.initializer.append(divisor)
        smoothed = f"smooth_{index}_out"
        mul = onnx.helper.make_node("Mul", [tensor, divisor.name], [smoothed], name=f"smooth_{index}")
        first = min(list(model.graph.node).index(n) for n in nodes)
        model.graph.node.insert(first, mul)
        for node in nodes:
            node.input[0] = smoothed
    _drop_unused(model)
    return len(groups)


def _channel_maxima(model: Any, tensors: list[str], windows: Sequence[Feeds]) -> dict[str, npt.NDArray[np.float32]]:
    """The largest absolute value of each last-axis channel of ``tensors`` over the first windows."""
    onnx = importlib.import_module("onnx")
    ort = importlib.import_module("onnxruntime")
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in known:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    maxima: dict[str, npt.NDArray[np.float32]] = {}
    for feeds in windows[:_MEASURED]:
        for name, value in zip(tensors, session.run(tensors, dict(feeds)), strict=True):
            channel = np.abs(np.asarray(value, dtype=np.float32)).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = channel if name not in maxima else np.maximum(maxima[name], channel)
    return maxima


def _drop_unused(model: Any) -> None:
    used = {name for node in model.graph.node for name in node.input}
    keep = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
