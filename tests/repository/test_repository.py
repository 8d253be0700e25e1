"""The model repository: config.pbtxt parsing, Triton's auto-complete and defaults, checks with locations."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format

import modelsvc.repository
from modelsvc.repository import ConfigError, ModelRepository, ModelSource
from modelsvc.tools.onnx_models import add_sub, identity, token_classifier, write_model

FULL_IDENTITY = """\
name: "ident"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
"""


def load(repo: Path, name: str, **kwargs: object) -> ModelSource:
    return ModelRepository(repo, gpus=(), **kwargs).load(name)  # type: ignore[arg-type]


def config_dict(source: ModelSource) -> dict[str, object]:
    return json_format.MessageToDict(source.config, preserving_proto_field_name=True)


def test_exports_are_sorted_and_complete() -> None:
    names = modelsvc.repository.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), n))
    assert {"ConfigError", "ModelRepository", "ModelSource"} <= set(names)
    for name in names:
        assert hasattr(modelsvc.repository, name)


# --- ConfigError --------------------------------------------------------------------------------------


def test_config_error_str_with_and_without_location() -> None:
    assert str(ConfigError(Path("m/config.pbtxt"), "bad", 3, 7)) == "m/config.pbtxt:3:7: bad"
    assert str(ConfigError(Path("m/config.pbtxt"), "bad", 3)) == "m/config.pbtxt:3: bad"
    assert str(ConfigError(Path("m"), "bad")) == "m: bad"
    err = ConfigError("m/config.pbtxt", "bad", 1, 2)
    assert (err.path, err.line, err.column, err.message) == (Path("m/config.pbtxt"), 1, 2, "bad")


# --- parsing ------------------------------------------------------------------------------------------


def test_parse_error_has_file_line_and_column(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "ident", identity(), 'name: "ident"\nmax_batch_size: 4\n  bogus_field: 3\n')
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "ident")
    err = info.value
    assert (err.path, err.line, err.column) == (model_dir / "config.pbtxt", 3, 3)
    assert "bogus_field" in err.message
    assert str(err).startswith(f"{model_dir / 'config.pbtxt'}:3:3: ")


def test_parse_error_bad_enum(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), 'input [ { name: "INPUT0"\n data_type: TYPE_FLOAT32 } ]')
    with pytest.raises(ConfigError, match="TYPE_FLOAT32") as info:
        load(tmp_path, "ident")
    assert info.value.line == 2


# --- names, backends ----------------------------------------------------------------------------------


def test_model_names_skip_hidden_and_non_models(tmp_path: Path) -> None:
    write_model(tmp_path, "b_model", identity(), None)
    write_model(tmp_path, "a_model", identity(), FULL_IDENTITY.replace("ident", "a_model"))
    write_model(tmp_path, ".hidden", identity(), None)
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("hi")
    assert ModelRepository(tmp_path, gpus=()).model_names() == ["a_model", "b_model"]


def test_name_defaults_to_directory(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), "max_batch_size: 2")
    assert load(tmp_path, "ident").config.name == "ident"


def test_name_mismatch_is_located(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "ident",
        identity(),
        '# a comment { naming name: "x"\nmax_batch_size: 2 # [\nname: "other"\n',
    )
    with pytest.raises(ConfigError, match="'other' but its directory is 'ident'") as info:
        load(tmp_path, "ident")
    assert (info.value.line, info.value.column) == (3, 1)


def test_missing_model_and_file_instead_of_directory(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    repo = ModelRepository(tmp_path, gpus=())
    with pytest.raises(ConfigError, match="not found") as info:
        repo.load("nope")
    assert info.value.path == tmp_path / "nope"
    with pytest.raises(ConfigError, match="must be a directory"):
        repo.load("afile")
    with pytest.raises(ConfigError, match="not a model name"):
        repo.load("../x")


@pytest.mark.parametrize(
    ("config", "fragment", "line"),
    [
        ('backend: "dali"\n', "backend 'dali' is not supported", 1),
        (
            'max_batch_size: 0\nplatform: "tensorflow_savedmodel"\n',
            "backend 'tensorflow' is not supported",
            2,
        ),
        ('platform: "onnxruntime_onnx"\nbackend: "tensorrt"\n', "disagree", 2),
    ],
)
def test_unknown_or_inconsistent_backend(tmp_path: Path, config: str, fragment: str, line: int) -> None:
    write_model(tmp_path, "ident", identity(), config)
    with pytest.raises(ConfigError, match=fragment) as info:
        load(tmp_path, "ident")
    assert info.value.line == line


def test_no_backend_and_no_model_file(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no platform or backend"):
        load(tmp_path, "m")


def test_backend_detected_from_python_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text("")
    with pytest.raises(ConfigError, match=r"model\.py' defines no class TritonPythonModel"):
        load(tmp_path, "m")


def test_platform_fills_backend_and_default_model_filename(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "ident", identity(), None)
    (model_dir / "1" / "model.onnx").rename(model_dir / "1" / "custom.onnx")
    (model_dir / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\ndefault_model_filename: "custom.onnx"')
    source = load(tmp_path, "ident")
    assert source.config.backend == "onnxruntime"
    assert source.artifact(1) == model_dir / "1" / "custom.onnx"
    assert len(source.config.input) == 1


# --- auto-complete ------------------------------------------------------------------------------------


def test_missing_config_is_autocompleted(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "ident", identity(), None)
    source = load(tmp_path, "ident")
    assert source.path == model_dir
    assert source.versions == [1]
    assert source.artifact(1) == model_dir / "1" / "model.onnx"
    assert config_dict(source) == {
        "name": "ident",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["16"]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["16"]}],
        "instance_group": [{"name": "ident", "kind": "KIND_CPU", "count": 2}],
        "dynamic_batching": {},
    }


def test_autocomplete_non_batching_model(tmp_path: Path) -> None:
    write_model(tmp_path, "fixed", identity(dims=[2, "n"]), None)
    config = load(tmp_path, "fixed").config
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [2, -1]


def test_partial_config_is_completed_not_overwritten(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "tc",
        token_classifier(),
        'max_batch_size: 2\ninput [ { name: "input_ids" dims: [ 128 ] } ]\n',
    )
    config = load(tmp_path, "tc").config
    assert config.max_batch_size == 2
    assert config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input_ids", 9, [128]),  # TYPE_INT64 = 9; the narrower dims the config gives are kept
        ("attention_mask", 9, [-1]),
    ]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [4])]


def test_listed_outputs_are_a_subset_that_is_kept(tmp_path: Path) -> None:
    write_model(tmp_path, "add_sub", add_sub(), 'output [ { name: "OUTPUT1" } ]')
    config = load(tmp_path, "add_sub").config
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("OUTPUT1", 11, [16])]  # TYPE_FP32
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


def test_max_batch_size_one_gets_no_dynamic_batching(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), "max_batch_size: 1")
    config = load(tmp_path, "ident").config
    assert config.max_batch_size == 1
    assert not config.HasField("dynamic_batching")


def test_existing_scheduler_choice_is_kept(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), "dynamic_batching { max_queue_delay_microseconds: 100 }")
    config = load(tmp_path, "ident").config
    assert config.max_batch_size == 4
    assert config.dynamic_batching.max_queue_delay_microseconds == 100


def test_full_config_is_left_alone(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), FULL_IDENTITY)
    config = load(tmp_path, "ident").config
    assert config.max_batch_size == 8
    assert not config.HasField("dynamic_batching")  # Triton adds none when inputs and outputs are given


def test_full_config_without_batching_keeps_full_dims(tmp_path: Path) -> None:
    text = FULL_IDENTITY.replace("max_batch_size: 8", "max_batch_size: 0").replace("[ 16 ]", "[ -1, 16 ]")
    write_model(tmp_path, "ident", identity(), text)
    config = load(tmp_path, "ident").config
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, 16]


def test_batching_a_fixed_batch_model_is_an_error(tmp_path: Path) -> None:
    write_model(tmp_path, "fixed", identity(dims=[2, 16]), 'name: "fixed"\nmax_batch_size: 8\n')
    with pytest.raises(ConfigError, match="no variable first") as info:
        load(tmp_path, "fixed")
    assert (info.value.line, info.value.column) == (2, 1)


def test_config_tensor_the_model_lacks(tmp_path: Path) -> None:
    text = (
        'max_batch_size: 4\ninput [\n  { name: "INPUT0" },\n  { name: "INPUT9" data_type: TYPE_FP32 dims: [16] }\n]\n'
    )
    write_model(tmp_path, "ident", identity(), text)
    with pytest.raises(ConfigError, match="'INPUT9' is not an input of the model") as info:
        load(tmp_path, "ident")
    assert (info.value.line, info.value.column) == (4, 5)


def test_config_datatype_disagrees_with_model(tmp_path: Path) -> None:
    text = 'input [ {\n  name: "INPUT0"\n  data_type: TYPE_INT32\n} ]'
    write_model(tmp_path, "ident", identity(), text)
    with pytest.raises(ConfigError, match="TYPE_INT32, the model has TYPE_FP32") as info:
        load(tmp_path, "ident")
    assert (info.value.line, info.value.column) == (3, 3)


def test_config_dims_disagree_with_model(tmp_path: Path) -> None:
    text = 'output [ { name: "OUTPUT0"\n dims: [ 8 ] } ]'
    write_model(tmp_path, "ident", identity(), text)
    with pytest.raises(ConfigError, match="dims") as info:
        load(tmp_path, "ident")
    assert (info.value.line, info.value.column) == (2, 2)


def test_unreadable_model_file(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(ConfigError, match="auto-complete failed"):
        load(tmp_path, "m")


# --- strict mode --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"strict_model_config": True}, {"autocomplete": False}])
def test_strict_mode_needs_a_config(tmp_path: Path, kwargs: dict[str, bool]) -> None:
    write_model(tmp_path, "ident", identity(), None)
    with pytest.raises(ConfigError, match=r"no config\.pbtxt"):
        load(tmp_path, "ident", **kwargs)


@pytest.mark.parametrize("kwargs", [{"strict_model_config": True}, {"autocomplete": False}])
def test_strict_mode_needs_inputs_and_outputs(tmp_path: Path, kwargs: dict[str, bool]) -> None:
    write_model(tmp_path, "ident", identity(), "max_batch_size: 4")
    with pytest.raises(ConfigError, match="lists no inputs"):
        load(tmp_path, "ident", **kwargs)


def test_strict_mode_takes_a_full_config_as_is(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), FULL_IDENTITY.replace('platform: "onnxruntime_onnx"\n', ""))
    config = load(tmp_path, "ident", strict_model_config=True).config
    assert config.max_batch_size == 8
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert not config.HasField("dynamic_batching")
    assert config.instance_group[0].kind == 2  # KIND_CPU: the default group is filled in strict mode too


# --- versions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        ("", [3]),
        ("version_policy { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy { latest { num_versions: 5 } }", [1, 2, 3]),
        ("version_policy { all {} }", [1, 2, 3]),
        ("version_policy { specific { versions: [3, 1] } }", [1, 3]),
    ],
)
def test_version_policy(tmp_path: Path, policy: str, versions: list[int]) -> None:
    model_dir = write_model(tmp_path, "ident", identity(), policy, versions=(1, 2, 3))
    (model_dir / "latest").mkdir()  # not numeric: ignored
    source = load(tmp_path, "ident")
    assert source.versions == versions
    assert source.config.HasField("version_policy")


def test_specific_version_missing(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "ident",
        identity(),
        "version_policy {\n  specific { versions: [ 1, 4 ] }\n}",
        versions=(1, 2),
    )
    with pytest.raises(ConfigError, match="version 4, which has no directory") as info:
        load(tmp_path, "ident")
    assert (info.value.line, info.value.column) == (2, 14)


def test_no_versions(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    with pytest.raises(ConfigError, match="no version directories"):
        load(tmp_path, "m")


def test_latest_zero_versions(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), "version_policy { latest { } }")
    with pytest.raises(ConfigError, match="num_versions"):
        load(tmp_path, "ident")


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fragment", "line", "column"),
    [
        ("max_batch_size: -1\n", "max_batch_size must be 0", 1, 1),
        (
            'max_batch_size: 4\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },\n'
            '        { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n',
            "listed more than once",
            3,
            11,
        ),
        (
            'max_batch_size: 4\ninput [ { name: "INPUT0"\n  data_type: TYPE_FP32\n  dims: [ 0 ] } ]\n',
            "each dimension must be at least 1",
            4,
            3,
        ),
        (
            "max_batch_size: 4\ndynamic_batching {\n  preferred_batch_size: [ 2, 8 ]\n}\n",
            "preferred_batch_size 8",
            3,
            3,
        ),
        (
            "max_batch_size: 4\ndynamic_batching {\n  priority_levels: 2\n  default_priority_level: 3\n}\n",
            "default_priority_level must be between 1 and priority_levels (2)",
            4,
            3,
        ),
        (
            "max_batch_size: 4\ndynamic_batching {\n  priority_levels: 2\n  default_priority_level: 1\n"
            "  priority_queue_policy { key: 3 value { timeout_action: REJECT } }\n}\n",
            "priority_queue_policy has level 3",
            5,
            3,
        ),
        (
            "max_batch_size: 4\ndynamic_batching { default_priority_level: 1 }\n",
            "priority_levels is 0",
            2,
            20,
        ),
        (
            "instance_group [ { kind: KIND_CPU },\n  { count: 1\n    kind: KIND_MODEL } ]\n",
            "KIND_MODEL",
            3,
            5,
        ),
        ("instance_group [ { count: -2 } ]\n", "count must be at least 1", 1, 20),
    ],
)
def test_validation_errors_are_located(tmp_path: Path, config: str, fragment: str, line: int, column: int) -> None:
    model_dir = write_model(tmp_path, "ident", identity(), config)
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "ident")
    err = info.value
    assert fragment in err.message
    assert (err.path, err.line, err.column) == (model_dir / "config.pbtxt", line, column)


def test_dynamic_batching_without_batching_is_an_error(tmp_path: Path) -> None:
    write_model(tmp_path, "fixed", identity(dims=[2, 16]), "# no batching here\ndynamic_batching { }\n")
    with pytest.raises(ConfigError, match="dynamic_batching needs max_batch_size") as info:
        load(tmp_path, "fixed")
    assert (info.value.line, info.value.column) == (2, 1)


def test_missing_data_type_in_strict_mode(tmp_path: Path) -> None:
    text = FULL_IDENTITY.replace("    data_type: TYPE_FP32\n", "", 1)
    write_model(tmp_path, "ident", identity(), text)
    with pytest.raises(ConfigError, match="'INPUT0' has no data_type") as info:
        load(tmp_path, "ident", strict_model_config=True)
    assert (info.value.line, info.value.column) == (6, 5)  # at the input's name


# --- instance groups ----------------------------------------------------------------------------------


def test_default_instance_group_on_gpu_machine(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", identity(), None)
    config = ModelRepository(tmp_path, gpus=(0, 1)).load("ident").config
    group = json_format.MessageToDict(config.instance_group[0], preserving_proto_field_name=True)
    assert group == {"name": "ident", "kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}


def test_instance_groups_get_names_kinds_and_counts(tmp_path: Path) -> None:
    text = 'instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_AUTO }, { name: "g" kind: KIND_GPU } ]'
    write_model(tmp_path, "ident", identity(), text)
    groups = load(tmp_path, "ident").config.instance_group
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in groups] == [
        ("ident_0", 2, 2, []),
        ("ident_1", 2, 2, []),  # KIND_AUTO without a GPU: KIND_CPU, and 2 instances as Triton gives ORT
        ("g", 1, 1, []),  # KIND_GPU stays GPU; the backend decides whether it can run
    ]
    groups = ModelRepository(tmp_path, gpus=(0,)).load("ident").config.instance_group
    assert [(g.kind, list(g.gpus)) for g in groups] == [(2, []), (1, [0]), (1, [0])]


def test_add_sub_autocompletes_two_inputs_and_outputs(tmp_path: Path) -> None:
    write_model(tmp_path, "add_sub", add_sub(), None)
    config = load(tmp_path, "add_sub").config
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]


def test_default_cpu_instance_count_follows_triton(tmp_path: Path) -> None:
    """Triton gives KIND_CPU groups of onnxruntime (and tensorflow) models 2 instances when count is absent."""
    write_model(tmp_path, "cpu", identity(), 'platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_CPU } ]')
    assert load(tmp_path, "cpu").config.instance_group[0].count == 2
    write_model(tmp_path, "gpu", identity(), 'backend: "onnxruntime"\ninstance_group [ { kind: KIND_GPU } ]')
    assert ModelRepository(tmp_path, gpus=(0,)).load("gpu").config.instance_group[0].count == 1
