"""Small ONNX models built with onnx's helper API, and a writer for Triton-layout repositories.

Nothing is downloaded: every model here is a few graph nodes. The quickstart repository
(services/quickstart/build_models.py), the tests and the benchmarks in loadtests build their models with it, so it
lives where all three may import it. Needs ``onnx`` (the ``dev`` or ``export`` extra).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17

_ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def identity(datatype: str = "FP32", dims: list[int | str] | None = None) -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0 unchanged; dims default to [batch, 16]."""
    dims = dims if dims is not None else ["batch", 16]
    t = _ONNX_TYPES[datatype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", t, dims)],
        [helper.make_tensor_value_info("OUTPUT0", t, dims)],
    )
    return _model(graph)


def add_sub(dims: list[int | str] | None = None) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, dims default [batch, 16])."""
    dims = dims if dims is not None else ["batch", 16]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info("INPUT0", f, dims), helper.make_tensor_value_info("INPUT1", f, dims)],
        [
            helper.make_tensor_value_info("OUTPUT0", f, dims),
            helper.make_tensor_value_info("OUTPUT1", f, dims),
        ],
    )
    return _model(graph)


def token_classifier(
    vocab: int = 1000, hidden: int = 64, labels: int = 4, layers: int = 0, seed: int = 0
) -> onnx.ModelProto:
    """A small transformer-shaped model: int64 input_ids and attention_mask [batch, seq] -> logits [batch, labels].

    Embedding lookup, ``layers`` rounds of (MatMul + Tanh) over every token, masked mean pooling, a linear head.
    With layers > 0 the compute grows with batch x seq like a real encoder's feed-forward blocks.
    """
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32) * 0.1, "emb"),
        numpy_helper.from_array(rng.standard_normal((hidden, labels)).astype(np.float32) * 0.1, "head_w"),
        numpy_helper.from_array(np.zeros(labels, np.float32), "head_b"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["h0"]),  # [b, s, h]
    ]
    cur = "h0"
    for i in range(layers):
        # the scale as float32: numpy 2 would promote the weights to float64, which the graph does not declare
        w = rng.standard_normal((hidden, hidden)).astype(np.float32) / np.float32(np.sqrt(hidden))
        init.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"]))
        cur = f"h{i + 1}"
    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),  # [b, s]
        helper.make_node("Unsqueeze", ["mask_f", "axis_last"], ["mask3"]),  # [b, s, 1]
        helper.make_node("Mul", [cur, "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),  # [b, h]
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),  # [b, 1]
        helper.make_node("Max", ["count", "one"], ["count_safe"]),
        helper.make_node("Div", ["summed", "count_safe"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "head_w"], ["proj"]),
        helper.make_node("Add", ["proj", "head_b"], ["logits"]),
    ]
    init.append(numpy_helper.from_array(np.array([1.0], np.float32), "one"))
    i64 = TensorProto.INT64
    graph = helper.make_graph(
        nodes,
        "token_classifier",
        [
            helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", i64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", labels])],
        initializer=init,
    )
    return _model(graph)


def write_model(
    repo: Path, name: str, model: onnx.ModelProto, config: str | None, versions: tuple[int, ...] = (1,)
) -> Path:
    """Write ``repo/name/<v>/model.onnx`` for each version and ``config.pbtxt`` when given."""
    model_dir = repo / name
    for v in versions:
        (model_dir / str(v)).mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(model_dir / str(v) / "model.onnx"))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir
