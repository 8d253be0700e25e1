"""ONNX Runtime's transformer optimizer (``model_type="bert"``) on the exported model, prepared so it fuses.

The optimizer fuses attention, layer normalization and GELU into ONNX Runtime's own operators. Its
attention fusion looks for the mask as two one-axis Unsqueezes, while the dynamo exporter folds
``mask[:, None, None, :]`` into a single two-axis Unsqueeze, so multi-axis Unsqueezes are split again
before optimizing (the mask itself is prepared by the wrapper; see ``_wrapper``). The fused Attention gets
the raw 2-D mask (``use_raw_attention_mask``), not ONNX Runtime's default for BERT of one length per row,
which would be wrong for left padding or a mask with holes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper, numpy_helper

from ._errors import ExportUsageError, first_line

__all__ = ["optimize"]


def _split_unsqueezes(model: onnx.ModelProto) -> int:
    """Turn each Unsqueeze with several constant, non-negative axes into a chain of one-axis Unsqueezes.

    The result is the same tensor (inserting the axes one at a time in ascending order lands each where
    the combined node puts it); ONNX Runtime's attention fusion needs the chain. Returns the count split.
    """
    graph = model.graph
    constants: dict[str, npt.NDArray[Any]] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    nodes: list[onnx.NodeProto] = []
    split = 0
    for node in graph.node:
        axes = constants.get(node.input[1]) if node.op_type == "Unsqueeze" and len(node.input) == 2 else None
        if axes is None or axes.size < 2 or (axes < 0).any():
            nodes.append(node)
            continue
        split += 1
        current = node.input[0]
        ordered = sorted(int(a) for a in axes.reshape(-1))
        for step, axis in enumerate(ordered):
            axis_name = f"{node.output[0]}__axis{axis}"
            graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), axis_name))
            out = node.output[0] if step == len(ordered) - 1 else f"{node.output[0]}__unsqueeze{step}"
            nodes.append(helper.make_node("Unsqueeze", [current, axis_name], [out], name=f"{node.name}__{step}"))
            current = out
    if split:
        del graph.node[:]
        graph.node.extend(nodes)
        _drop_unused_initializers(model)
    return split


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    graph = model.graph
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _prune_opsets(model: onnx.ModelProto) -> None:
    """Keep the opset imports the graph's nodes use (ONNX Runtime's optimizer writes every domain it knows)."""
    used = {node.domain or "" for node in model.graph.node} | {""}
    keep = [op for op in model.opset_import if (op.domain or "") in used or op.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def optimize(source: Path, target: Path, config: Any, large: bool) -> dict[str, int]:
    """ONNX Runtime's BERT optimizer on ``source`` (split Unsqueezes first), written to ``target``."""
    try:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as exc:  # pragma: no cover - onnxruntime ships onnxruntime.transformers
        raise ExportUsageError(f"optimize needs onnxruntime.transformers: {first_line(exc)}") from exc
    model = onnx.load(str(source))
    _split_unsqueezes(model)
    prepared = source.with_name("prepared.onnx")
    onnx.save(model, str(prepared), save_as_external_data=large, location="prepared.onnx.data")
    del model
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "dim", 0) or 0)
    fusion = FusionOptions("bert")
    fusion.use_raw_attention_mask(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(
            str(prepared), model_type="bert", num_heads=heads, hidden_size=hidden, optimization_options=fusion
        )
    statistics = {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
    _prune_opsets(optimized.model)
    optimized.save_model_to_file(str(target), use_external_data_format=large)
    return statistics
