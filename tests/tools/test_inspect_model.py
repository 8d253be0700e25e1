"""``modelsvc inspect``: real ONNX files built with onnx's helper API, read back as tables and JSON, and the
errors for files that are missing, not models, or TensorRT engines without TensorRT."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelsvc import _cli
from modelsvc.tools import onnx_models as om
from modelsvc.tools.inspect_model import InspectError, TensorInfo, format_dims, inspect_model, render_text, to_json
from tests._server import ROOT


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_token_classifier(tmp_path: Path) -> None:
    model = om.token_classifier(vocab=1000, hidden=64, labels=4, layers=1)
    info = inspect_model(_save(tmp_path, model))
    assert info.format == "onnx"
    assert info.inputs == (
        TensorInfo("input_ids", "TYPE_INT64", (-1, -1), ("batch", "sequence")),
        TensorInfo("attention_mask", "TYPE_INT64", (-1, -1), ("batch", "sequence")),
    )
    assert info.outputs == (TensorInfo("logits", "TYPE_FP32", (-1, 4), ("batch", None)),)
    assert info.opsets == {"ai.onnx": om.OPSET}
    assert info.ir_version == 8
    assert info.graph_name == "token_classifier"
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert info.parameter_count == sum(w.size for w in weights) == 1000 * 64 + 64 * 64 + 64 * 4 + 4 + 1 + 1 + 1
    assert info.parameter_bytes == sum(w.nbytes for w in weights)
    assert info.external_data == ()

    text = render_text(info)
    assert "input_ids       TYPE_INT64  [-1 (batch), -1 (sequence)]" in text
    assert "logits  TYPE_FP32  [-1 (batch), 4]" in text
    assert f"opsets: ai.onnx {om.OPSET}" in text
    assert "IR version: 8" in text
    assert "parameters: 68.36k (68,359), 267.0 KiB" in text


def test_json_round_trips(tmp_path: Path) -> None:
    info = inspect_model(_save(tmp_path, om.add_sub()))
    data = json.loads(json.dumps(to_json(info)))
    assert data["format"] == "onnx"
    assert data["inputs"] == [
        {"name": "INPUT0", "datatype": "TYPE_FP32", "dims": [-1, 16], "dim_names": ["batch", None]},
        {"name": "INPUT1", "datatype": "TYPE_FP32", "dims": [-1, 16], "dim_names": ["batch", None]},
    ]
    assert [o["name"] for o in data["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert data["opsets"] == {"ai.onnx": om.OPSET}
    assert data["parameter_count"] == 0
    assert data["profiles"] == []


def test_datatypes_fixed_and_unnamed_dims(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"]), helper.make_node("Cast", ["half"], ["wide"], to=11)],
        "types",
        [
            helper.make_tensor_value_info("text", TensorProto.STRING, [None, 3]),
            helper.make_tensor_value_info("half", TensorProto.FLOAT16, [2, "n"]),
        ],
        [
            helper.make_tensor_value_info("same", TensorProto.STRING, [None, 3]),
            helper.make_tensor_value_info("wide", TensorProto.DOUBLE, [2, "n"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.producer_name, model.producer_version = "hand", "1.0"
    info = inspect_model(_save(tmp_path, model))
    text, half = info.inputs
    assert text == TensorInfo("text", "TYPE_STRING", (-1, 3), (None, None))
    assert half.datatype == "TYPE_FP16"
    assert format_dims(half) == "[2, -1 (n)]"
    assert info.outputs[1].datatype == "TYPE_FP64"
    assert info.opsets == {"ai.onnx": 17, "ai.onnx.ml": 3}
    assert info.producer == "hand 1.0"


def test_external_data_is_not_read(tmp_path: Path) -> None:
    weights = np.arange(4096, dtype=np.float32).reshape(64, 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        initializer=[numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "big.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="big.onnx.data", size_threshold=0)
    (tmp_path / "big.onnx.data").write_bytes(b"")  # unreadable weights: inspect must not need them
    info = inspect_model(path)
    assert info.parameter_count == 4096
    assert info.parameter_bytes == 4096 * 4
    assert info.external_data == ("big.onnx.data",)
    assert "external data: big.onnx.data" in render_text(info)


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save(tmp_path, om.token_classifier())
    assert _cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path} (ONNX model, ")
    assert "[-1 (batch), -1 (sequence)]" in out
    done = subprocess.run(
        [sys.executable, "-m", "modelsvc", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"][0]["dims"] == [-1, 4]


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.onnx"
    assert _cli.main(["inspect", str(missing)]) == 2
    assert capsys.readouterr().err == f"modelsvc inspect: {missing}: no such file\n"

    text = tmp_path / "notes.onnx"
    text.write_text("these are notes, not a model\n")
    assert _cli.main(["inspect", str(text)]) == 2
    assert f"{text} is not an ONNX model" in capsys.readouterr().err

    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(InspectError, match="is not an ONNX model"):
        inspect_model(empty)

    assert _cli.main(["inspect", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="checks the message without TensorRT")
def test_plan_without_tensorrt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"\x00" * 64)
    assert _cli.main(["inspect", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'modelsvc[tensorrt]'" in err
    assert "Traceback" not in err


def test_missing_extras_are_named(tmp_path: Path) -> None:
    """A .pt without torch and a .xml without openvino: an InspectError naming the extra, not a traceback; and
    `modelsvc export --format openvino` without openvino: exit 2 naming the extra, before the model is loaded."""
    (tmp_path / "model.pt").write_bytes(b"x")
    (tmp_path / "model.xml").write_text("<net/>")
    (tmp_path / "model.bin").write_bytes(b"")
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['openvino'] = None\n"
        "from modelsvc.tools.inspect_model import InspectError, inspect_model\n"
        "for name in ('model.pt', 'model.xml'):\n"
        "    try:\n"
        "        inspect_model(sys.argv[1] + '/' + name)\n"
        "    except InspectError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "is a TorchScript model; reading it needs torch: pip install 'modelsvc[pytorch]'" in done.stdout
    assert "is an OpenVINO IR; reading it needs openvino: pip install 'modelsvc[openvino]'" in done.stdout
    export = "import sys; sys.modules['openvino'] = None; from modelsvc._cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["export", str(tmp_path / "nothing"), "--model-repository", str(tmp_path / "r"), "--model-name", "m"]
    done = subprocess.run(
        [sys.executable, "-c", export, *args, "--format", "openvino"], capture_output=True, text=True, cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--format openvino needs OpenVINO" in done.stderr
    assert "pip install 'modelsvc[openvino]'" in done.stderr
    assert not (tmp_path / "r").exists()
