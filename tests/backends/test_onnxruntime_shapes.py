"""Inputs that fit the config but not each other, on ONNX Runtime (issue 29), in process with real sessions.

ONNX Runtime reports such a run as FAIL, as it reports any fault, so the backend asks the model
(``modelsvc/backends/onnxruntime/_onnxruntime_shapes.py``):

- inputs whose dimensions the graph names alike get different sizes: refused before the run, naming the dimension;
- dimensions named apart: after the failed run, ONNX's strict shape inference with the inputs' shapes rejects
  them, and the 400 carries ONNX Runtime's words and the inference's;
- a run that fails for another reason (here out of memory), with shapes the model accepts, stays a 500.

The contract every backend keeps over HTTP and gRPC is in tests/backends/test_backend_contract.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelsvc.backends import InputsMismatch
from modelsvc.backends._shapes import Verdicts
from modelsvc.protocol import ErrorKind, InternalError
from modelsvc.tools.onnx_models import add_sub, token_classifier
from tests.backends.test_onnxruntime_backend import one_instance


def _renamed(model: onnx.ModelProto, dims: dict[str, list[str]]) -> onnx.ModelProto:
    """``model`` with its inputs' dimensions named as ``dims`` says."""
    for value in model.graph.input:
        for dim, name in zip(value.type.tensor_type.shape.dim, dims[value.name], strict=True):
            dim.Clear()
            dim.dim_param = name
    return model


def test_inputs_of_one_named_dimension_are_refused_before_the_run(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "tc", token_classifier(vocab=50, hidden=8))  # [batch, sequence] twice
    ids = np.ones((1, 5), np.int64)
    with pytest.raises(InputsMismatch) as info:
        instance.execute({"input_ids": ids, "attention_mask": np.ones((1, 6), np.int64)}, ["logits"])
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert str(info.value) == (
        "inputs input_ids [1,5] and attention_mask [1,6] do not fit model 'tc': the model names dimension 1 of "
        "input_ids and dimension 1 of attention_mask both 'sequence', one size, but they are 5 and 6"
    )
    assert instance.execute({"input_ids": ids, "attention_mask": ids}, ["logits"])["logits"].shape == (1, 4)


def test_a_failed_run_whose_shapes_the_model_rejects_is_refused_in_both_words(tmp_path: Path) -> None:
    model = _renamed(add_sub(), {"INPUT0": ["b0", "n0"], "INPUT1": ["b1", "n1"]})  # nothing ties them
    instance = one_instance(tmp_path, "add_sub", model)
    a, b = np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)
    for _ in range(2):  # the second time from the remembered verdict
        with pytest.raises(InputsMismatch) as info:
            instance.execute({"INPUT0": a, "INPUT1": b}, [])
        message = str(info.value)
        assert message.startswith("inputs INPUT0 [2,3] and INPUT1 [2,4] do not fit model 'add_sub': ")
        assert "Attempting to broadcast an axis by a dimension other than 1. 3 by 4" in message  # ONNX Runtime's
        assert "(ONNX shape inference: (op_type:Add): [ShapeInferenceError] Incompatible dimensions)" in message
    np.testing.assert_array_equal(instance.execute({"INPUT0": a, "INPUT1": a}, ["OUTPUT0"])["OUTPUT0"], a + a)


def test_a_run_that_fails_with_shapes_the_model_accepts_stays_internal(tmp_path: Path) -> None:
    """ConstantOfShape asked for 2**60 floats: ONNX Runtime's FAIL (its arena cannot allocate), not the request's
    shapes (one input of [2], which the model takes): a 500."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["SHAPE"], ["OUTPUT0"])],
        "fill",
        [helper.make_tensor_value_info("SHAPE", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["rows", "columns"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = (
        'name: "fill"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "SHAPE" data_type: TYPE_INT64 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
    )
    instance = one_instance(tmp_path, "fill", model, config)
    with pytest.raises(InternalError, match="Failed to allocate memory") as info:
        instance.execute({"SHAPE": np.array([1 << 40, 1 << 20], np.int64)}, [])
    assert not isinstance(info.value, InputsMismatch)
    assert instance.execute({"SHAPE": np.array([2, 3], np.int64)}, [])["OUTPUT0"].shape == (2, 3)


def test_verdicts_are_remembered_and_a_judge_that_cannot_tell_says_nothing() -> None:
    asked: list[Any] = []

    def judge(shapes: dict[str, tuple[int, ...]]) -> str | None:
        asked.append(shapes)
        if shapes["A"] == (0,):
            raise ValueError("cannot tell")
        return "no" if shapes["A"] != shapes["B"] else None

    verdicts = Verdicts(judge)
    assert verdicts.rejects({"A": (2, 3), "B": (2, 4)}) == "no"
    assert verdicts.rejects({"B": (2, 4), "A": (2, 3)}) == "no"  # the same shapes, in another order
    assert verdicts.rejects({"A": (2, 3), "B": (2, 3)}) is None
    assert verdicts.rejects({"A": (0,), "B": (0,)}) is None
    assert len(asked) == 3
