"""``modelsvc build``'s shapes: shape flags and their errors, profiles checked against the model's inputs,
profiles derived from real config.pbtxt files, the plan's config, and the inspector's layers.

The options, the CLI and the build_plan flow: tests/tools/test_build.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modelsvc.tools.inspect_model import onnx_tensors
from modelsvc.tools.onnx_models import identity, token_classifier
from modelsvc.tools.trt import (
    ShapeRange,
    check_profiles,
    layers_from_inspector,
    opt_batch_size,
    parse_profiles,
    parse_shape_spec,
    plan_config,
    precision_counts,
    profiles_from_config,
)
from modelsvc.tools.trt._config import config_text, read_config
from modelsvc.tools.trt._shapes import profile_shapes
from tests._trt_build import SERVICES, usage


def _config(text: str) -> Any:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


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
    with usage(message):
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
    with usage(message):
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
        with usage(message):
            check_profiles(parse_profiles([spec], [spec], [spec]), inputs)
    with usage(
        "the model has dynamic inputs ('input_ids' [-1, -1], 'attention_mask' [-1, -1]): give "
        "--min-shapes/--opt-shapes/--max-shapes or --from-config REPO/NAME"
    ):
        check_profiles([], inputs)


def test_fixed_dims_are_kept_and_completed() -> None:
    inputs, _ = onnx_tensors(identity(dims=["batch", 16]))
    with usage("profile 0: tensor 'INPUT0' dim 1 is fixed at 16 in the model, the profile gives 8..32"):
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
    with usage(message):
        profiles_from_config(_config(text), where="cfg")


def test_max_sequence_length_must_be_positive() -> None:
    with usage("--max-sequence-length must be at least 1, got 0"):
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
