"""``sequence_batching`` read and checked at load: Triton's defaults, and a precise error (located in config.pbtxt)
for each thing Triton refuses. No server: the repository's checks and the settings' parser directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from modelsvc.backends import ModelConfig, ModelLoadError
from modelsvc.protocol import InvalidArgument
from modelsvc.repository import ConfigError, ModelRepository
from modelsvc.scheduler import SequenceSettings, load_initial_states
from modelsvc.scheduler.sequence._sequence_rows import request_params

HEAD = """name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _settings(body: str) -> SequenceSettings:
    config = text_format.Parse(HEAD + body, ModelConfig())
    settings = SequenceSettings.from_model_config(config)
    assert settings is not None
    return settings


def _load_error(tmp_path: Path, body: str, head: str = HEAD) -> ConfigError:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(head + body)
    with pytest.raises(ConfigError) as info:
        ModelRepository(tmp_path, gpus=(), autocomplete=False).load("m")
    return info.value


def test_defaults_as_triton() -> None:
    direct = _settings("sequence_batching { }")
    assert (direct.strategy, direct.slots, direct.idle_ns, direct.max_queue_delay_ns) == ("direct", 4, 10**9, 0)
    oldest = _settings(
        "sequence_batching { max_sequence_idle_microseconds: 5000 oldest { max_candidate_sequences: 16 } }"
    )
    assert (oldest.strategy, oldest.slots, oldest.idle_ns) == ("oldest", 16, 5_000_000)
    controls = _settings(
        'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        'bool_false_true: [ false, true ] } ] }, { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_STRING } ] } ] "
        'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 2 ] } ] }'
    )
    assert controls.input_names == {"S", "C", "I"}
    assert controls.state_outputs == ("O",)
    assert controls.controls["START"].dtype == np.dtype(bool)
    assert controls.controls["CORRID"].dtype == np.dtype(object)
    assert controls.states[0].start_value().tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("body", "message", "line"),
    [
        (
            'sequence_batching {\n control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 1 ] } ] } ] }",
            "control 'S' (CONTROL_SEQUENCE_START) int32_false_true must have exactly 2 values (false, true), got 1",
            7,
        ),
        (
            'sequence_batching {\n control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ] }",
            "control 'C' (CONTROL_SEQUENCE_CORRID) has data_type TYPE_FP32; it must be one of TYPE_UINT64",
            7,
        ),
        (
            'sequence_batching {\n control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END '
            'fp32_false_true: [ 0, 1 ] } ] },\n { name: "B" control [ { kind: CONTROL_SEQUENCE_END '
            "fp32_false_true: [ 0, 1 ] } ] } ] }",
            "more than one CONTROL_SEQUENCE_END control ('A' and 'B')",
            7,
        ),
        (
            'sequence_batching {\n state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 2 ]\n'
            ' initial_state { data_type: TYPE_FP32 dims: [ 3 ] name: "x" zero_data: true } } ] }',
            "'initial_state' dim for input name 'I' doesn't match 'state' dim description. 3 != 2",
            8,
        ),
        (
            'sequence_batching {\n state [ { input_name: "INPUT" output_name: "O" data_type: TYPE_INT32 dims: [ 1 ] '
            "} ] }",
            "sequence_batching feeds input 'INPUT' (a control or state input); remove it from the model's input list",
            1,
        ),
        (
            "sequence_batching {\n oldest { preferred_batch_size: [ 8 ] } }",
            "oldest preferred_batch_size 8 must be between 1 and max_batch_size (4)",
            7,
        ),
    ],
)
def test_bad_sequence_batching_is_a_located_error(tmp_path: Path, body: str, message: str, line: int) -> None:
    error = _load_error(tmp_path, body)
    assert message in str(error)
    assert error.line is not None
    assert error.line >= line


def test_with_dynamic_batching_refused_as_triton_refuses_it(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "dynamic_batching { }\nsequence_batching { }")
    assert "another member of oneof" in str(error)


def test_control_tensors_only_for_backends_that_take_them(tmp_path: Path) -> None:
    head = HEAD.replace('backend: "python"', 'backend: "openvino"')
    body = (
        'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        "fp32_false_true: [ 0, 1 ] } ] } ] }"
    )
    error = _load_error(tmp_path, body, head)
    assert "supported for the python and onnxruntime backends; model 'm' uses backend 'openvino'" in str(error)


def test_initial_state_data_file(tmp_path: Path) -> None:
    body = (
        'sequence_batching { state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ 2 ] '
        'initial_state { data_type: TYPE_INT32 dims: [ 2 ] name: "x" data_file: "init.bin" } } ] }'
    )
    settings = _settings(body)
    with pytest.raises(ModelLoadError, match="initial_state data_file of state input 'I': cannot read"):
        load_initial_states(settings, tmp_path)
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([7], np.int32).tobytes())
    with pytest.raises(ModelLoadError, match="initial_state setting expects 8 bytes, but the data provided"):
        load_initial_states(settings, tmp_path)
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([7, 9], np.int32).tobytes())
    load_initial_states(settings, tmp_path)
    assert settings.states[0].start_value().tolist() == [7, 9]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": ""}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": True}, "'sequence_id' must be an unsigned integer or a string, got True"),
        ({"sequence_id": 1.5}, "'sequence_id' must be an unsigned integer or a string, got 1.5"),
        ({"sequence_id": -3}, "'sequence_id' must be an unsigned 64-bit integer, got -3"),
        ({"sequence_id": 3, "sequence_start": "yes"}, "'sequence_start' must be a boolean, got 'yes'"),
    ],
)
def test_request_parameters(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        request_params(params, "m")


def test_request_parameters_as_tritonclient_sends_them() -> None:
    assert request_params({"sequence_id": 5, "sequence_start": True, "sequence_end": False}, "m") == (5, True, False)
    assert request_params({"sequence_id": "doc-1", "sequence_end": True}, "m") == ("doc-1", False, True)
    assert request_params({"sequence_id": 2**64 - 1}, "m") == (2**64 - 1, False, False)
