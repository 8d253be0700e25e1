"""``modelsvc build``: shape flags and their errors, profiles derived from real config.pbtxt files, the plan's
config, the inspector's layers, the CLI without TensorRT, and the whole build_plan flow around TensorRT (the
check against ONNX Runtime, the tolerance, what is written and when) with TensorRT's part replaced by an ONNX
stand-in. The ``gpu`` tests build real plans; they skip where TensorRT or a GPU is missing."""

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
from modelsvc.tools.onnx_models import identity, token_classifier, write_model
from modelsvc.tools.trt import (
    DEFAULT_TOLERANCES,
    TENSORRT_EXTRA,
    BuildCheckError,
    BuildOptions,
    BuildUsageError,
    ShapeRange,
    build_plan,
    check_profiles,
    layers_from_inspector,
    opt_batch_size,
    parse_profiles,
    parse_shape_spec,
    plan_config,
    precision_counts,
    profiles_from_config,
    tolerances,
)
from modelsvc.tools.trt import _build as build_module
from modelsvc.tools.trt._builder import BuiltPlan
from modelsvc.tools.trt._config import config_text, read_config
from modelsvc.tools.trt._shapes import profile_shapes
from tests._build_fakes import OnnxAsPlan
from tests._server import ROOT

SERVICES = ROOT / "services"


def _config(text: str) -> Any:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _usage(match: str) -> Any:
    return pytest.raises(BuildUsageError, match=re.escape(match))


# --- shape flags ------------------------------------------------------------------------------------------


def test_shape_spec_parses_names_and_dims() -> None:
    assert parse_shape_spec("input_ids:8x128,attention_mask:8x128", "--opt-shapes") == {
        "input_ids": (8, 128),
        "attention_mask": (8, 128),
    }
    # a name may hold colons: the shape is what follows the last one
    assert parse_shape_spec("scope:x:4", "--min-shapes") == {"scope:x": (4,)}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--min-shapes is empty: write name:AxB[,name2:CxD...]"),
        ("a:1x2,,b:3", "--min-shapes 'a:1x2,,b:3' has an empty entry"),
        ("input_ids", "--min-shapes: 'input_ids' has no shape; write input_ids:AxB"),
        (":1x2", "--min-shapes: ':1x2' has no tensor name before the colon"),
        ("a:1,a:2", "--min-shapes: tensor 'a' is given twice"),
        ("a:", "--min-shapes: tensor 'a' has no dims after the colon"),
        ("a:1xb", "--min-shapes: tensor 'a' has shape '1xb', whose dim 'b' is not a whole number"),
        ("a:1x-1", "--min-shapes: tensor 'a' has shape '1x-1', whose dim '-1' is not a whole number"),
        ("a:1x0", "--min-shapes: tensor 'a' has shape '1x0', whose dims must be at least 1"),
    ],
)
def test_shape_spec_errors(spec: str, message: str) -> None:
    with _usage(message):
        parse_shape_spec(spec, "--min-shapes")


def test_repeated_flags_form_one_profile_each() -> None:
    profiles = parse_profiles(["x:1x1", "x:9x1"], ["x:4x8", "x:16x8"], ["x:8x16", "x:32x64"])
    assert profiles == [
        {"x": ShapeRange((1, 1), (4, 8), (8, 16))},
        {"x": ShapeRange((9, 1), (16, 8), (32, 64))},
    ]
    assert parse_profiles([], [], []) == []


@pytest.mark.parametrize(
    ("mins", "opts", "maxs", "message"),
    [
        (
            ["x:1"],
            [],
            ["x:2"],
            "each profile needs all three shape flags, once each: given --min-shapes 1 time, "
            "--opt-shapes 0 times, --max-shapes 1 time",
        ),
        (
            ["x:1,y:1"],
            ["x:1"],
            ["x:1,y:1"],
            "profile 0: tensor 'y' is in --min-shapes and --max-shapes but not in --opt-shapes",
        ),
        (
            ["x:1"],
            ["x:1"],
            ["x:1,z:2"],
            "profile 0: tensor 'z' is in --max-shapes but not in --min-shapes or --opt-shapes",
        ),
        (
            ["x:1x2"],
            ["x:1x2x3"],
            ["x:1x2"],
            "profile 0: tensor 'x' has shapes of different ranks: min 1x2, opt 1x2x3, max 1x2",
        ),
        (
            ["x:1x16", "x:1x1"],
            ["x:1x8", "x:1x1"],
            ["x:1x32", "x:1x1"],
            "profile 0: tensor 'x' dim 1 needs min <= opt <= max, got 16, 8, 32",
        ),
        (
            ["x:1", "x:1"],
            ["x:2", "x:4"],
            ["x:3", "x:3"],
            "profile 1: tensor 'x' dim 0 needs min <= opt <= max, got 1, 4, 3",
        ),
    ],
)
def test_profile_errors(mins: list[str], opts: list[str], maxs: list[str], message: str) -> None:
    with _usage(message):
        parse_profiles(mins, opts, maxs)


# --- profiles against the model's inputs ----------------------------------------------------------------


def test_profiles_checked_against_the_model() -> None:
    inputs, _ = onnx_tensors(token_classifier())
    ok = parse_profiles(
        ["input_ids:1x1,attention_mask:1x1"],
        ["input_ids:4x64,attention_mask:4x64"],
        ["input_ids:8x128,attention_mask:8x128"],
    )
    assert check_profiles(ok, inputs) == ok
    cases = [
        ("y:1", "profile 0: tensor 'y' is not an input of the model (its inputs: input_ids, attention_mask)"),
        ("input_ids:1x1x1", "profile 0: tensor 'input_ids' is given rank 3 (1x1x1), the model's input has rank 2"),
        (
            "input_ids:1x1",
            "profile 0: input 'attention_mask' has dynamic dims [-1, -1] and needs shapes in every profile",
        ),
    ]
    for spec, message in cases:
        with _usage(message):
            check_profiles(parse_profiles([spec], [spec], [spec]), inputs)
    with _usage(
        "the model has dynamic inputs ('input_ids' [-1, -1], 'attention_mask' [-1, -1]): give "
        "--min-shapes/--opt-shapes/--max-shapes or --from-config REPO/NAME"
    ):
        check_profiles([], inputs)


def test_fixed_dims_are_kept_and_completed() -> None:
    inputs, _ = onnx_tensors(identity(dims=["batch", 16]))
    with _usage("profile 0: tensor 'INPUT0' dim 1 is fixed at 16 in the model, the profile gives 8..32"):
        check_profiles(parse_profiles(["INPUT0:1x8"], ["INPUT0:2x16"], ["INPUT0:4x32"]), inputs)
    fixed, _ = onnx_tensors(identity(dims=[2, 16]))
    assert check_profiles([], fixed) == [{"INPUT0": ShapeRange((2, 16), (2, 16), (2, 16))}]


# --- profiles from config.pbtxt -------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["embedder", "doc_classifier"])
def test_minilm_configs_of_the_services(service: str) -> None:
    config = read_config(SERVICES / service / "model_repository" / "minilm")
    (profile,) = profiles_from_config(config)
    # max_batch_size 16, no preferred sizes: opt batch 8; the sequence axis 1..512, opt 128
    expected = ShapeRange((1, 1), (8, 128), (16, 512))
    assert profile == {"input_ids": expected, "attention_mask": expected, "token_type_ids": expected}
    (short,) = profiles_from_config(config, max_sequence_length=64)
    assert short["input_ids"] == ShapeRange((1, 1), (8, 64), (16, 64))


def test_quickstart_configs() -> None:
    repo = SERVICES / "quickstart" / "model_repository"
    (identity_profile,) = profiles_from_config(read_config(repo / "identity"))
    assert identity_profile == {"INPUT0": ShapeRange((1, 16), (16, 16), (32, 16))}
    (tc,) = profiles_from_config(read_config(repo / "token_classifier"))
    assert tc["input_ids"] == ShapeRange((1, 1), (8, 128), (16, 512))


def test_preferred_batch_size_is_the_opt() -> None:
    config = _config(
        'name: "m" max_batch_size: 64 input [{ name: "x" data_type: TYPE_INT64 dims: [-1] }] '
        "dynamic_batching { preferred_batch_size: [8, 32] }"
    )
    assert profiles_from_config(config)[0]["x"] == ShapeRange((1, 1), (32, 128), (64, 512))
    assert [opt_batch_size(n) for n in (1, 2, 3, 16, 32)] == [1, 1, 2, 8, 16]
    assert opt_batch_size(8, [16, 4]) == 4  # a preferred size above the max is not one


def test_no_batching_fixed_dims() -> None:
    config = _config('name: "m" max_batch_size: 0 input [{ name: "x" data_type: TYPE_FP32 dims: [2, 3] }]')
    assert profiles_from_config(config) == [{"x": ShapeRange((2, 3), (2, 3), (2, 3))}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name: "m" max_batch_size: 8',
            "cfg: 'm' lists no inputs (it leaves them to auto-complete), so no profile can be derived",
        ),
        (
            'name: "m" max_batch_size: 0 input [{ name: "x" data_type: TYPE_INT64 dims: [-1, -1] }]',
            "cfg: max_batch_size is 0 and input 'x' has dims [-1, -1]: which -1 is the batch and which a sequence "
            "cannot be told",
        ),
        (
            'name: "m" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [4] '
            "reshape { shape: [2, 2] } }]",
            "cfg: input 'x' has a reshape, so its dims are not the model's",
        ),
        (
            'name: "m" platform: "ensemble" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]',
            "cfg: 'm' is an ensemble; build the models of its steps one by one",
        ),
        (
            'name: "m" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [-2] }]',
            "cfg: input 'x' has dims [-2]: each is -1 or at least 1",
        ),
        (
            'name: "m" max_batch_size: 4 input [{ name: "x" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }]',
            "cfg: input 'x' is a shape tensor",
        ),
    ],
)
def test_configs_profiles_cannot_come_from(text: str, message: str) -> None:
    with _usage(message):
        profiles_from_config(_config(text), where="cfg")


def test_max_sequence_length_must_be_positive() -> None:
    with _usage("--max-sequence-length must be at least 1, got 0"):
        profiles_from_config(_config('name: "m" max_batch_size: 1 input [{ name: "x" dims: [-1] }]'), 0)


def test_profile_shapes_are_min_opt_max_once_each() -> None:
    profile = {"x": ShapeRange((1, 4), (1, 4), (2, 4))}
    assert profile_shapes(profile) == [{"x": (1, 4)}, {"x": (2, 4)}]


# --- the plan's config.pbtxt ----------------------------------------------------------------------------


def test_plan_config_from_a_service_config() -> None:
    source = read_config(SERVICES / "embedder" / "model_repository" / "minilm")
    source.parameters["intra_op_thread_count"].string_value = "2"
    source.optimization.execution_accelerators.cpu_execution_accelerator.add(name="openvino")
    source.default_model_filename = "encoder.onnx"
    text = config_text(plan_config(source, "minilm_trt"), Path("repo/minilm/1/model.onnx"), "fp16")
    assert text.startswith("# Written by `modelsvc build` from repo/minilm/1/model.onnx (fp16).")
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert parsed.name == "minilm_trt"
    assert parsed.platform == "tensorrt_plan"
    assert parsed.backend == ""
    assert parsed.default_model_filename == ""  # Triton's default for a plan: model.plan
    assert parsed.max_batch_size == 16
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in parsed.instance_group] == [
        (1, "KIND_GPU")
    ]
    assert [i.name for i in parsed.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [list(o.dims) for o in parsed.output] == [[-1, 384], [384]]
    assert not parsed.parameters
    assert not parsed.HasField("optimization")
    assert not parsed.HasField("version_policy")


def test_plan_config_without_instance_group_gets_a_gpu_one() -> None:
    parsed = plan_config(_config('name: "m" backend: "onnxruntime" max_batch_size: 2'), "m")
    assert [model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in parsed.instance_group] == ["KIND_GPU"]


# --- the report's layers --------------------------------------------------------------------------------


def test_layers_from_inspector_json() -> None:
    ten = {
        "Layers": [
            {
                "Name": "gemm_0",
                "LayerType": "CaskGemm",
                "Outputs": [{"Name": "h", "Format/Datatype": "Row major linear FP16 format"}],
            },
            {"Name": "reformat", "LayerType": "Reformat", "Outputs": [{"Format/Datatype": "Row major linear FP32"}]},
            {"Name": "cast", "LayerType": "Cast", "Outputs": [{"Format/Datatype": "Row major linear Int32"}]},
        ],
        "Bindings": ["input_ids", "logits"],
    }
    eleven = {
        "Layers": [{"Name": "mm", "LayerType": "Myelin", "Outputs": [{"DataType": "Half"}, {"DataType": "Float"}]}]
    }
    layers = layers_from_inspector(json.dumps(ten))
    assert [(la.name, la.layer_type, la.precisions) for la in layers] == [
        ("gemm_0", "CaskGemm", ("FP16",)),
        ("reformat", "Reformat", ("FP32",)),
        ("cast", "Cast", ("INT32",)),
    ]
    assert precision_counts(layers) == {"FP16": 1, "FP32": 1, "INT32": 1}
    assert layers_from_inspector(json.dumps(eleven))[0].precisions == ("FP16", "FP32")
    names_only = layers_from_inspector('{"Layers": ["a", "b"]}')
    assert [(la.name, la.precisions) for la in names_only] == [("a", ()), ("b", ())]
    assert precision_counts(names_only) == {}
    assert layers_from_inspector("") == []
    assert layers_from_inspector("[1]") == []


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
    with _usage(message):
        build_plan(dataclasses.replace(options, **changes))
    assert not (tmp_path / "out").exists()


def test_the_source_folder_is_never_the_target(tmp_path: Path) -> None:
    source = _repo(tmp_path)
    with _usage("the plan model would replace the source model's folder"):
        build_plan(BuildOptions(from_config=source, model_repository=tmp_path / "repo"))


def test_missing_source_onnx(tmp_path: Path) -> None:
    source = _repo(tmp_path)
    (source / "1" / "model.onnx").unlink()
    with _usage(f"--from-config: {source / '1' / 'model.onnx'} does not exist; build it first"):
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
    with _usage(f"ONNX Runtime's own operators (com.microsoft: {op}), which TensorRT's ONNX parser does not read"):
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
    with _usage(f"--npz {too_long}: its shapes fit no profile of the plan"):
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
    with _usage("--calib-npz"):
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
