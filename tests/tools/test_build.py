"""``modelsvc build``: the tolerances and options and their errors, the CLI without TensorRT, and the whole
build_plan flow around TensorRT (the check against ONNX Runtime, the tolerance, what is written and when) with
TensorRT's part replaced by an ONNX stand-in. The ``gpu`` tests build real plans; they skip where TensorRT or a
GPU is missing.

Shape flags, profiles from real config.pbtxt files, the plan's config and the inspector's layers:
tests/tools/test_build_profiles.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modelsvc._cli import _build as cli_build
from modelsvc.tools import trt as build_pkg
from modelsvc.tools.inspect_model import onnx_tensors
from modelsvc.tools.onnx_models import token_classifier, write_model
from modelsvc.tools.trt import DEFAULT_TOLERANCES, TENSORRT_EXTRA, BuildCheckError, BuildOptions, build_plan, tolerances
from modelsvc.tools.trt import _build as build_module
from modelsvc.tools.trt._builder import BuiltPlan
from tests._build_fakes import OnnxAsPlan
from tests._trt_build import SERVICES, usage

# --- tolerances and options -----------------------------------------------------------------------------


def test_default_tolerances_and_their_help_agree() -> None:
    help_text = cli_build.TOLERANCE_HELP
    for precision, (atol, rtol) in DEFAULT_TOLERANCES.items():
        if precision == "tf32":
            assert f"--tf32: atol {atol:g} rtol {rtol:g}".replace("0.05", "5e-2").replace("0.01", "1e-2") in help_text
            continue
        words = f"{precision} atol {atol:.0e} rtol {rtol:.0e}".replace("e-0", "e-").replace("0e+00", "0")
        assert words in help_text, words
    assert tolerances(BuildOptions(precision="fp16")) == (5e-2, 1e-2)
    assert tolerances(BuildOptions(tf32=True)) == DEFAULT_TOLERANCES["tf32"]
    assert tolerances(BuildOptions(precision="fp16", atol=0.5)) == (0.5, 1e-2)


def _repo(tmp_path: Path) -> Path:
    text = (SERVICES / "quickstart" / "model_repository" / "token_classifier" / "config.pbtxt").read_text()
    write_model(tmp_path / "repo", "token_classifier", token_classifier(), text)
    return tmp_path / "repo" / "token_classifier"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"from_config": None}, "give --onnx MODEL.onnx and --save-engine OUT.plan, or --from-config REPO/NAME"),
        ({"model_repository": None}, "--from-config needs --model-repository DIR"),
        ({"save_engine": Path("x.plan")}, "--save-engine does not go with --from-config"),
        ({"model_name": "../x"}, "model name '../x' cannot be a folder name in a model repository"),
        ({"precision": "int8"}, "has no QuantizeLinear/DequantizeLinear nodes: quantize it first"),
        ({"calib": Path("c.cache")}, "--calib and --calib-npz go with --int8"),
        ({"tf32": True, "precision": "fp16"}, "--tf32 applies to fp32 builds, not --fp16"),
        ({"builder_optimization_level": 6}, "--builder-optimization-level 6 is outside 0..5"),
        ({"workspace": 0}, "--workspace 0 MiB must be at least 1"),
        ({"atol": float("nan")}, "--atol nan must be a finite number >= 0"),
        ({"version": 0}, "version 0 must be at least 1"),
        ({"precision": "fp8"}, "precision 'fp8' is not one of fp32, fp16, bf16, int8"),
    ],
)
def test_bad_options(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    options = BuildOptions(from_config=_repo(tmp_path), model_repository=tmp_path / "out")
    with usage(message):
        build_plan(dataclasses.replace(options, **changes))
    assert not (tmp_path / "out").exists()


def test_the_source_folder_is_never_the_target(tmp_path: Path) -> None:
    source = _repo(tmp_path)
    with usage("the plan model would replace the source model's folder"):
        build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "repo"))


def test_missing_source_onnx(tmp_path: Path) -> None:
    source = _repo(tmp_path)
    (source / "1" / "model.onnx").unlink()
    with usage(f"--from-config: {source / '1' / 'model.onnx'} does not exist; build it first"):
        build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "out"))


def test_onnx_runtime_fused_operators_are_refused(tmp_path: Path) -> None:
    """`modelsvc export --optimize` fuses attention into com.microsoft operators that only ONNX Runtime runs."""
    import onnx

    source = _repo(tmp_path)
    path = source / "1" / "model.onnx"
    model = onnx.load(str(path))
    for node in model.graph.node[:1]:
        node.domain = "com.microsoft"
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(path))
    op = model.graph.node[0].op_type
    with usage(f"ONNX Runtime's own operators (com.microsoft: {op}), which TensorRT's ONNX parser does not read"):
        build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# --- the CLI without TensorRT ---------------------------------------------------------------------------


def _has_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_has_tensorrt(), reason="TensorRT is installed here")
@pytest.mark.parametrize("mode", ["from-config", "onnx"])
def test_cli_without_tensorrt_is_a_usage_error(tmp_path: Path, mode: str) -> None:
    source = _repo(tmp_path)
    if mode == "from-config":
        args = ["--from-config", str(source), "--model-repository", str(tmp_path / "out"), "--fp16"]
    else:
        shapes = "input_ids:{0},attention_mask:{0}"
        args = [
            "--onnx",
            str(source / "1" / "model.onnx"),
            "--save-engine",
            str(tmp_path / "out" / "m.plan"),
            "--min-shapes",
            shapes.format("1x1"),
            "--opt-shapes",
            shapes.format("4x64"),
            "--max-shapes",
            shapes.format("8x128"),
            "--timing-cache",
            str(tmp_path / "out" / "timing.cache"),
        ]
    done = subprocess.run(
        [sys.executable, "-m", "modelsvc", "build", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert TENSORRT_EXTRA in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "out").exists()


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "modelsvc", "build", "--onnx", str(tmp_path / "none.onnx"), "--save-engine", "x.plan"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert f"--onnx {tmp_path / 'none.onnx'}: no such file" in done.stderr
    assert not (tmp_path / "x.plan").exists()


# --- build_plan around TensorRT: an ONNX stand-in for the plan ------------------------------------------


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """TensorRT's part replaced: build_serialized returns the bytes of ``plan_model`` as the 'plan'."""
    import modelsvc.tools.compare as compare

    state: dict[str, Any] = {"plan_model": token_classifier(), "settings": []}
    scratch = tmp_path / "stand-in"
    scratch.mkdir()
    OnnxAsPlan.folder = str(scratch)
    OnnxAsPlan.opened = []

    def fake_build(onnx_path: Path, profiles: Any, settings: Any, log: Any) -> BuiltPlan:
        state["settings"].append(settings)
        state["profiles"] = profiles
        inspector = {"Layers": [{"Name": "l0", "LayerType": "Gemm", "Outputs": [{"DataType": "Half"}]}]}
        return BuiltPlan(
            plan=state["plan_model"].SerializeToString(),
            seconds=1.5,
            tensorrt_version="stand-in",
            inspector_json=json.dumps(inspector),
            timing_cache=b"timing-" + bytes(len(state["settings"])),
            timing_cache_loaded=bool(settings.timing_cache),
        )

    monkeypatch.setattr(build_module, "import_tensorrt", lambda: None)
    monkeypatch.setattr(build_module, "can_calibrate", lambda trt: True)
    monkeypatch.setattr(build_module, "build_serialized", fake_build)
    monkeypatch.setattr(compare, "PlanRunner", OnnxAsPlan)
    return state


def test_build_plan_checks_then_writes_the_model(tmp_path: Path, stand_in: dict[str, Any]) -> None:
    source = _repo(tmp_path)
    out = tmp_path / "out"
    options = BuildOptions(
        from_config=source,
        model_repository=out,
        model_name="tc_trt",
        version=3,
        precision="fp16",
        timing_cache=tmp_path / "timing.cache",
        max_sequence_length=64,
    )
    report = build_plan(options)
    plan_path = out / "tc_trt" / "3" / "model.plan"
    assert report.plan_path == plan_path
    assert plan_path.read_bytes() == token_classifier().SerializeToString()
    config = text_format.Parse((out / "tc_trt" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.platform == "tensorrt_plan"
    assert config.name == "tc_trt"
    assert config.max_batch_size == 16
    # min, opt and max of the derived profile: batch 1..16 (opt 8), sequence 1..64 (opt 64)
    assert [case.shapes["input_ids"] for case in report.checks] == [(1, 1), (8, 64), (16, 64)]
    assert all(case.report.passed for case in report.checks)
    assert (report.atol, report.rtol) == DEFAULT_TOLERANCES["fp16"]
    assert [(la.name, la.precisions) for la in report.layers] == [("l0", ("FP16",))]
    assert report.timing_cache_saved
    assert not report.timing_cache_loaded
    assert options.timing_cache is not None
    assert options.timing_cache.read_bytes() == b"timing-\x00"
    assert not [p for p in (out / "tc_trt").rglob("*") if p.name.startswith(".")], "a temporary file was left"

    # a second build starts from the saved timing cache, and saves the grown one
    again = build_plan(options)
    assert stand_in["settings"][1].timing_cache == b"timing-\x00"
    assert again.timing_cache_loaded
    assert options.timing_cache.read_bytes() == b"timing-\x00\x00"


def test_over_the_tolerance_nothing_is_written(tmp_path: Path, stand_in: dict[str, Any]) -> None:
    stand_in["plan_model"] = token_classifier(seed=1)  # other weights: a plan that computes something else
    source = _repo(tmp_path)
    out = tmp_path / "out"
    timing = tmp_path / "timing.cache"
    with pytest.raises(
        BuildCheckError, match=r"differs from ONNX Runtime beyond atol 0\.0001 \+ rtol 0 in logits"
    ) as e:
        build_plan(BuildOptions(from_config=source, model_repository=out, timing_cache=timing))
    assert "nothing was written" in str(e.value)
    assert e.value.comparisons
    assert not e.value.comparisons[0].report.passed
    assert e.value.comparisons[0].report.outputs[0].max_abs > 1e-4
    assert not out.exists()
    assert not timing.exists()


def test_save_engine_with_shape_flags_and_several_profiles(tmp_path: Path, stand_in: dict[str, Any]) -> None:
    onnx_path = _repo(tmp_path) / "1" / "model.onnx"
    both = "input_ids:{0},attention_mask:{0}"
    options = BuildOptions(
        onnx=onnx_path,
        save_engine=tmp_path / "plans" / "tc.plan",
        min_shapes=(both.format("1x1"), both.format("9x1")),
        opt_shapes=(both.format("2x8"), both.format("12x8")),
        max_shapes=(both.format("4x16"), both.format("16x16")),
    )
    report = build_plan(options)
    assert (tmp_path / "plans" / "tc.plan").is_file()
    assert report.config_path is None
    assert [(c.profile, c.shapes["input_ids"]) for c in report.checks] == [
        (0, (1, 1)),
        (0, (2, 8)),
        (0, (4, 16)),
        (1, (9, 1)),
        (1, (12, 8)),
        (1, (16, 16)),
    ]
    assert OnnxAsPlan.opened == [0, 1]


def test_npz_inputs_are_checked_on_the_profile_they_fit(tmp_path: Path, stand_in: dict[str, Any]) -> None:
    onnx_path = _repo(tmp_path) / "1" / "model.onnx"
    both = "input_ids:{0},attention_mask:{0}"
    npz = tmp_path / "inputs.npz"
    np.savez(npz, input_ids=np.arange(30, dtype=np.int64).reshape(3, 10), attention_mask=np.ones((3, 10), np.int64))
    options = BuildOptions(
        onnx=onnx_path,
        save_engine=tmp_path / "tc.plan",
        npz=npz,
        min_shapes=(both.format("1x1"), both.format("3x1")),
        opt_shapes=(both.format("1x4"), both.format("3x8")),
        max_shapes=(both.format("2x8"), both.format("4x16")),
    )
    report = build_plan(options)
    assert [(c.profile, c.shapes) for c in report.checks] == [(1, {"input_ids": (3, 10), "attention_mask": (3, 10)})]
    too_long = tmp_path / "long.npz"
    np.savez(too_long, input_ids=np.zeros((1, 99), np.int64), attention_mask=np.ones((1, 99), np.int64))
    with usage(f"--npz {too_long}: its shapes fit no profile of the plan"):
        build_plan(dataclasses.replace(options, npz=too_long, save_engine=tmp_path / "other.plan"))
    assert not (tmp_path / "other.plan").exists()


def test_int8_calibration_batches(tmp_path: Path, stand_in: dict[str, Any]) -> None:
    source = _repo(tmp_path)
    npz = tmp_path / "calib.npz"
    np.savez(npz, input_ids=np.ones((40, 32), np.int64), attention_mask=np.ones((40, 32), np.int64))
    build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "out", precision="int8", calib_npz=npz))
    batches = stand_in["settings"][0].calibration_batches
    assert [b["input_ids"].shape for b in batches] == [(16, 32), (16, 32)]  # 40 rows: two of 16, the short one dropped
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, input_ids=np.ones((4, 8), np.int64), attention_mask=np.ones((3, 8), np.int64))
    with usage("--calib-npz"):
        build_plan(
            BuildOptions(from_config=source, model_repository=tmp_path / "o2", precision="int8", calib_npz=ragged)
        )


def test_the_package_exports() -> None:
    for name in build_pkg.__all__:
        assert hasattr(build_pkg, name), name


# --- on a GPU with TensorRT -----------------------------------------------------------------------------


def _gpu_reason() -> str | None:
    if not _has_tensorrt():
        return f"TensorRT is not installed ({TENSORRT_EXTRA})"
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return f"cuda-python is not installed ({TENSORRT_EXTRA})"
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count < 1:
        return f"no CUDA GPU ({err})"
    return None


def _require_gpu() -> None:
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_builds_a_checked_plan(tmp_path: Path, precision: str) -> None:
    _require_gpu()
    source = _repo(tmp_path)
    out = tmp_path / "out"
    report = build_plan(
        BuildOptions(from_config=source, model_repository=out, precision=precision, max_sequence_length=64)
    )
    assert report.plan_path == out / "token_classifier" / "1" / "model.plan"
    assert report.plan_path.stat().st_size == report.plan_bytes > 0
    assert report.checks
    assert all(case.report.passed for case in report.checks)
    assert report.layers, "the engine inspector gave no layers"
    assert report.tensorrt_version.split(".")[0].isdigit()
    config = text_format.Parse(
        report.config_path.read_text() if report.config_path else "", model_config_pb2.ModelConfig()
    )
    assert config.platform == "tensorrt_plan"
    model = onnx.load(str(source / "1" / "model.onnx"))
    assert [t.name for t in onnx_tensors(model)[0]] == list(report.profiles[0])


@pytest.mark.gpu
def test_gpu_timing_cache_is_reused(tmp_path: Path) -> None:
    _require_gpu()
    onnx_path = _repo(tmp_path) / "1" / "model.onnx"
    both = "input_ids:{0},attention_mask:{0}"
    timing = tmp_path / "timing.cache"
    options = BuildOptions(
        onnx=onnx_path,
        save_engine=tmp_path / "a.plan",
        timing_cache=timing,
        precision="fp16",
        min_shapes=(both.format("1x1"),),
        opt_shapes=(both.format("4x32"),),
        max_shapes=(both.format("8x64"),),
    )
    first = build_plan(options)
    assert first.timing_cache_saved
    assert not first.timing_cache_loaded
    assert timing.stat().st_size > 0
    second = build_plan(dataclasses.replace(options, save_engine=tmp_path / "b.plan"))
    assert second.timing_cache_loaded
    assert second.timing_cache_saved


def test_cli_prints_the_report(tmp_path: Path, stand_in: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from modelsvc._cli import main

    source = _repo(tmp_path)
    args = ["build", "--from-config", str(source), "--model-repository", str(tmp_path / "out"), "--fp16"]
    assert main([*args, "--max-sequence-length", "32"]) == 0
    printed = capsys.readouterr().out
    assert "with TensorRT stand-in (fp16)" in printed
    assert "profile 0 (min..opt..max): input_ids 1x1..8x32..16x32, attention_mask 1x1..8x32..16x32" in printed
    assert "layers: 1 (FP16 1)" in printed
    assert "plan vs ONNX Runtime (atol 0.05, rtol 0.01):" in printed
    assert re.search(r"logits\s+16x4\s+0\s+0\s+ok", printed), printed
    assert f"wrote {tmp_path / 'out' / 'token_classifier' / '1' / 'model.plan'}" in printed

    stand_in["plan_model"] = token_classifier(seed=2)
    assert main([*args[:-2], str(tmp_path / "out2"), "--max-sequence-length", "32"]) == 1
    captured = capsys.readouterr()
    assert "OVER" in captured.out
    assert "nothing was written" in captured.err
    assert not (tmp_path / "out2").exists()
