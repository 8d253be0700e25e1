"""``modelsvc export --format torchscript|openvino --precision fp32|bf16|int8``: tiny BERTs exported for real,
checked before they are written, served by one real modelsvc (HTTP and gRPC) and compared with PyTorch; what
cannot work together is refused; ``modelsvc inspect`` reads the .pt and the .xml."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from modelsvc import _cli
from modelsvc.tools import export as export_module
from modelsvc.tools.export import ExportOptions, ExportReport, export_model
from modelsvc.tools.inspect_model import InspectError, inspect_model
from tests._export_share import shared_onnx_export
from tests._server import ModelsvcProcess
from tests.tools.test_export import HIDDEN, _config, _pytorch_reference, _quiet, _tiny_bert

torch = pytest.importorskip("torch", reason="export needs modelsvc[export]")
pytest.importorskip("onnxscript", reason="export needs modelsvc[export]")
pytest.importorskip("openvino", reason="--format openvino needs modelsvc[openvino]")
pytest.importorskip("nncf", reason="--precision int8 with openvino needs modelsvc[openvino]")

#: model name -> (format, precision)
VARIANTS = {
    "ts": ("torchscript", "fp32"),
    "ov_bf16": ("openvino", "bf16"),
    "ov_int8": ("openvino", "int8"),
    "onnx_int8": ("onnx", "int8"),
}
# torchscript bf16 is traced and checked by test_cli (refused there at --min-cosine 1, where nothing is served)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert"), "Model")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> tuple[Path, dict[str, ExportReport]]:
    """The four variants exported for real. The three that start from ONNX (OpenVINO bf16 and int8, ONNX int8)
    share one torch.onnx export of the same tiny BERT with the same options: the ONNX export itself is
    tests/tools/test_export.py's subject (whose mean_repo exports this same model, so in a full run none is made here),
    here the point is what follows it (quantize, convert, check, serve); each export costs seconds of torch.export
    (tests/_export_share.py)."""
    repo = tmp_path_factory.mktemp("repo")
    reports = {}
    with shared_onnx_export() as used:
        for name, (fmt, precision) in VARIANTS.items():
            options = ExportOptions(
                model=str(tiny), model_repository=repo, model_name=name, pooling="mean", format=fmt,
                precision=precision, log=_quiet,
            )
            reports[name] = export_model(options)
    assert len(used) == 1, used  # one export, shared by the three ONNX-based variants
    return repo, reports


def test_files_configs_and_reports(exported: tuple[Path, dict[str, ExportReport]]) -> None:
    repo, reports = exported
    files = {"torchscript": ["model.pt"], "openvino": ["model.bin", "model.xml"], "onnx": ["model.onnx"]}
    for name, (fmt, precision) in VARIANTS.items():
        report = reports[name]
        assert sorted(p.name for p in (repo / name / "1").iterdir()) == files[fmt], name
        assert (report.format, report.precision) == (fmt, precision)
        config = _config(repo / name / "config.pbtxt")
        runtime = {"torchscript": ("", "pytorch_libtorch"), "openvino": ("openvino", ""), "onnx": ("onnxruntime", "")}
        assert (config.backend, config.platform) == runtime[fmt], name
        assert [(t.name, t.dims) for t in config.input] == [
            ("input_ids", [-1]), ("attention_mask", [-1]), ("token_type_ids", [-1])
        ]
        assert [(t.name, t.dims) for t in config.output] == [
            ("last_hidden_state", [-1, HIDDEN]), ("sentence_embedding", [HIDDEN])
        ]
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        assert parameters == ({"HINT_BF16": "YES"} if (fmt, precision) == ("openvino", "bf16") else {}), name
        if precision == "fp32":
            assert max(report.max_abs_diff.values()) <= 1e-4, name
        else:
            assert min(report.min_cosine.values()) >= 0.999, name
            assert max(report.max_abs_diff.values()) > 0, name  # really a lower precision
    # this CPU has no native bf16 on OpenVINO's plugin (AVX2 only): it says it ran f32, and the report says so
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        assert reports["ov_bf16"].ran_precision == "f32"


def _cosines(ours: np.ndarray[Any, Any], theirs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)


@pytest.mark.integration
def test_served_over_http_and_grpc(exported: tuple[Path, dict[str, ExportReport]], tiny: Path) -> None:
    repo, _ = exported
    rng = np.random.default_rng(11)
    ids = rng.integers(1, 100, size=(3, 10), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    expected = _pytorch_reference(tiny, feeds)
    with ModelsvcProcess(repo, "--strict-model-config", "true") as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for name, (_fmt, precision) in VARIANTS.items():
            assert http.is_model_ready(name), name
            for module in (httpclient, grpcclient):
                client = http if module is httpclient else grpc
                inputs = []
                for key, array in feeds.items():
                    inputs.append(module.InferInput(key, list(array.shape), "INT64"))
                    inputs[-1].set_data_from_numpy(array)
                result = client.infer(name, inputs)
                embedding = result.as_numpy("sentence_embedding")
                assert embedding.shape == (3, HIDDEN)
                if precision == "fp32":
                    np.testing.assert_allclose(embedding, expected["sentence_embedding"], atol=1e-4)
                else:
                    assert _cosines(embedding, expected["sentence_embedding"]).min() >= 0.999, name
        http.close()
        grpc.close()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "onnx", "precision": "bf16"}, "bf16 is not offered for --format onnx"),
        ({"format": "onnx", "precision": "int8", "optimize": True}, "int8 with --optimize"),
        ({"format": "openvino", "optimize": True}, "--optimize is ONNX Runtime's optimizer"),
        ({"format": "torchscript", "precision": "int8"}, "int8 is not offered for --format torchscript"),
        ({"min_cosine": 1.5}, "min cosine 1.5 must be in"),
    ],
)
def test_refused_combinations(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    options = ExportOptions(model="unused", model_repository=tmp_path, model_name="m", log=_quiet)
    with pytest.raises(export_module.ExportUsageError, match=message):
        export_model(dataclasses.replace(options, **changes))


def test_cli(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli._tools.FORMATS == export_module.FORMATS
    assert _cli._tools.PRECISIONS == export_module.PRECISIONS
    argv = ["export", str(tiny), "--model-repository", str(tmp_path), "--model-name", "m", "--pooling", "mean"]
    assert _cli.main([*argv, "--format", "onnx", "--precision", "bf16"]) == 2
    assert "bf16 is not offered" in capsys.readouterr().err
    # a lower precision under the bound: exit 1, the cosines shown, nothing written
    assert _cli.main([*argv, "--format", "torchscript", "--precision", "bf16", "--min-cosine", "1"]) == 1
    captured = capsys.readouterr()
    assert "torchscript bf16 vs PyTorch fp32 on random inputs (min cosine 1):" in captured.out
    assert "UNDER" in captured.out
    assert "< 1 (--min-cosine); model.pt not written" in captured.err
    assert not (tmp_path / "m").exists()


def test_inspect_torchscript_and_openvino(exported: tuple[Path, dict[str, ExportReport]]) -> None:
    repo, _ = exported
    script = inspect_model(repo / "ts" / "1" / "model.pt")
    assert script.format == "torchscript"
    assert [t.name for t in script.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [(t.name, t.datatype) for t in script.outputs] == [("OUTPUT__0", "unknown"), ("OUTPUT__1", "unknown")]
    assert any("forward(input_ids: Tensor" in note for note in script.notes)
    assert script.parameter_count > 0

    ir = inspect_model(repo / "ov_int8" / "1" / "model.xml")
    assert ir.format == "openvino"
    assert (ir.inputs[0].name, ir.inputs[0].datatype, ir.inputs[0].dims) == ("input_ids", "TYPE_INT64", (-1, -1))
    assert [(t.name, t.datatype, t.dims) for t in ir.outputs] == [
        ("last_hidden_state", "TYPE_FP32", (-1, -1, HIDDEN)), ("sentence_embedding", "TYPE_FP32", (-1, HIDDEN))
    ]
    assert any(note.startswith("weights: u8") for note in ir.notes)  # NNCF's int8 weights


def test_inspect_errors(tmp_path: Path, exported: tuple[Path, dict[str, ExportReport]]) -> None:
    repo, _ = exported
    lonely = tmp_path / "model.xml"
    lonely.write_bytes((repo / "ov_bf16" / "1" / "model.xml").read_bytes())
    with pytest.raises(InspectError, match=r"needs its weights beside it, model\.bin"):
        inspect_model(lonely)
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(InspectError, match="is not a TorchScript model"):
        inspect_model(garbage)
