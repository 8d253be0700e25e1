"""Whether a failed run was the inputs' shapes, by the ONNX model's own rules.

ONNX Runtime reports a kernel that cannot take its inputs' shapes (Add of [2,3] and [2,4]) as FAIL, as it
reports any other failure of a run, so its error class cannot tell a bad request from a fault. The model can:

- before the run, ``named_dims_disagree``: inputs whose dimensions the graph names alike (``dim_param``; ONNX:
  one name, one size) must get one size for them. Cheap; catches add_sub's ``[batch, n]`` and the exporters'
  ``[batch_size, sequence_length]`` pairs.
- after a failed run, where the ``onnx`` package is installed (the tensorrt extra brings it): ONNX's shape
  inference, strict, on the graph with the inputs' concrete shapes. It rejecting them says the request cannot
  fit; it accepting them leaves the failure ONNX Runtime's own (500). Initializers' data is dropped (beyond small
  ones that shape computations read), and a graph that strict inference rejects even with its declared shapes
  gives no verdict.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .._shapes import Shapes, Verdicts

logger = logging.getLogger(__name__)

#: initializers up to this many elements keep their data (shape constants that Reshape, Slice... read)
_KEPT_ELEMENTS = 64


def declared_dims(session: Any) -> dict[str, list[Any]]:
    """Each input's dims as ONNX Runtime reports them: int, a str for a named dimension, None for an unnamed one."""
    return {node.name: list(node.shape) for node in session.get_inputs() if isinstance(node.shape, list)}


class _OnnxJudge:
    def __init__(self, artifact: Path) -> None:
        self._artifact = artifact
        self._graph: Any = None  # the stripped model, read on first need
        self._usable: bool | None = None

    def _model(self) -> Any:
        import onnx

        if self._graph is None:
            model = onnx.load(str(self._artifact), load_external_data=False)
            for tensor in model.graph.initializer:
                count = 1
                for dim in tensor.dims:
                    count *= dim
                if count > _KEPT_ELEMENTS:
                    tensor.ClearField("raw_data")
                    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                        tensor.ClearField(field)
                    tensor.ClearField("external_data")
                    tensor.data_location = onnx.TensorProto.DEFAULT
            self._graph = model
        return self._graph

    def _infer(self, model: Any) -> str | None:
        import onnx

        try:
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as exc:
            text = " ".join(str(exc).split()).removeprefix("[ShapeInferenceError] Inference error(s): ")
            first, _, _ = text.partition(" (op_type:")  # the first node's error; the rest follow from it
            return first
        return None

    def __call__(self, shapes: Shapes) -> str | None:
        try:
            import onnx
        except ImportError:
            return None
        base = self._model()
        if self._usable is None:
            reason = self._infer(base)
            self._usable = reason is None
            if reason is not None:
                logger.info("'%s': ONNX shape inference rejects the graph as declared (%s)", self._artifact, reason)
        if not self._usable:
            return None
        model = onnx.ModelProto()
        model.CopyFrom(base)
        for value in model.graph.input:
            shape = shapes.get(value.name)
            if shape is None or not value.type.HasField("tensor_type"):
                continue
            dims = value.type.tensor_type.shape.dim
            if len(dims) != len(shape):
                return None  # the data plane checks ranks; leave this one to the runtime's words
            for dim, size in zip(dims, shape, strict=True):
                dim.Clear()
                dim.dim_value = size
        return self._infer(model)


def onnx_verdicts(artifact: Path) -> Verdicts:
    """The verdicts of ``artifact``'s own shape rules, shared by the model's instances."""
    return Verdicts(_OnnxJudge(artifact))
