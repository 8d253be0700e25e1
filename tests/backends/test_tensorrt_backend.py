"""The tensorrt backend: what it decides from an engine's description (fed here as data), the backend and its
instances around a stand-in engine, a served repository without TensorRT, and (``-m gpu``) real plans.

The GPU tests build tiny plans with TensorRT's builder from the ONNX models of ``modelsvc.tools.onnx_models``;
they skip with the reason where TensorRT or a GPU is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from modelsvc.backends import ConfigMismatchError, ModelConfig, ModelLoadError, get_backend
from modelsvc.backends._devices import Placement
from modelsvc.backends.tensorrt._tensorrt import TensorRTBackend, TensorRTInstance
from modelsvc.backends.tensorrt._tensorrt_spec import (
    EngineDescription,
    EngineProfile,
    EngineTensor,
    autocomplete_config,
    check_config,
    check_request_shapes,
    choose_profiles,
    config_datatype,
    deserialize_failure_message,
    engine_max_batch_size,
)
from modelsvc.protocol import InvalidArgument
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess, wait_for
from tests.conftest import identity_config, infer_input

Ranges = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def bert(int_type: str = "TYPE_INT32") -> EngineDescription:
    """A BERT-like engine: two token inputs [batch, seq], logits [batch, seq, 2]; two profiles."""
    tokens = ((1, 1), (8, 128), (32, 512))
    small = ((1, 1), (1, 128), (4, 128))
    return EngineDescription(
        tensors=(
            EngineTensor("input_ids", True, int_type, (-1, -1)),
            EngineTensor("attention_mask", True, int_type, (-1, -1)),
            EngineTensor("logits", False, "TYPE_FP32", (-1, -1, 2)),
        ),
        profiles=(
            EngineProfile({"input_ids": tokens, "attention_mask": tokens}),
            EngineProfile({"input_ids": small, "attention_mask": small}),
        ),
        trt_version="10.3.0",
    )


def parse(text: str) -> ModelConfig:
    config = text_format.Parse(text, ModelConfig())
    if not config.name:
        config.name = "m"
    return config


def shown(config: ModelConfig) -> dict[str, list[tuple[str, str, list[int]]]]:
    from tritonclient.grpc import model_config_pb2

    def rows(entries: Any) -> list[tuple[str, str, list[int]]]:
        return [(e.name, model_config_pb2.DataType.Name(e.data_type), list(e.dims)) for e in entries]

    return {"input": rows(config.input), "output": rows(config.output)}


# --- auto-complete ----------------------------------------------------------------------------------------------


def test_autocomplete_fills_names_datatypes_dims_and_max_batch_size_from_the_profiles() -> None:
    config = parse('name: "m" backend: "tensorrt"')
    autocomplete_config(config, bert())
    assert config.max_batch_size == 32  # the largest batch profile 0 accepts for every input
    assert config.HasField("dynamic_batching")
    assert shown(config) == {
        "input": [("input_ids", "TYPE_INT32", [-1]), ("attention_mask", "TYPE_INT32", [-1])],
        "output": [("logits", "TYPE_FP32", [-1, 2])],
    }


def test_autocomplete_keeps_a_smaller_max_batch_size_and_completes_listed_tensors() -> None:
    config = parse('name: "m" max_batch_size: 8 input [ { name: "input_ids" } ] output [ { name: "logits" } ]')
    autocomplete_config(config, bert())
    assert config.max_batch_size == 8
    assert not config.HasField("dynamic_batching")
    assert [e.name for e in config.input] == ["input_ids", "attention_mask"]  # the engine needs both
    assert shown(config)["output"] == [("logits", "TYPE_FP32", [-1, 2])]


def test_an_engine_without_a_batch_dimension_gets_full_dims_and_no_batching() -> None:
    desc = EngineDescription(
        (EngineTensor("x", True, "TYPE_FP16", (4, -1)), EngineTensor("y", False, "TYPE_FP16", (4, -1))),
        (EngineProfile({"x": ((4, 1), (4, 8), (4, 16))}),),
        "10.3.0",
    )
    assert engine_max_batch_size(desc) == 0
    config = parse('name: "m"')
    autocomplete_config(config, desc)
    assert config.max_batch_size == 0
    assert shown(config) == {"input": [("x", "TYPE_FP16", [4, -1])], "output": [("y", "TYPE_FP16", [4, -1])]}
    batched = parse('name: "m" max_batch_size: 4')
    with pytest.raises(ConfigMismatchError, match=r"no dynamic first \(batch\) dimension") as info:
        autocomplete_config(batched, desc)
    assert info.value.field == "max_batch_size"


def test_a_max_batch_size_beyond_the_profiles_names_the_limit() -> None:
    with pytest.raises(ConfigMismatchError) as info:
        autocomplete_config(parse('name: "big" max_batch_size: 64'), bert())
    message = str(info.value)
    assert "model 'big'" in message
    assert "at most 32" in message
    assert "input 'input_ids': profile 0: [1, 1]..[32, 512]; profile 1: [1, 1]..[4, 128]" in message
    assert info.value.field == "max_batch_size"


# --- load-time checks -------------------------------------------------------------------------------------------


def test_int64_in_the_config_against_int32_in_the_engine_is_named_as_the_classic_pitfall() -> None:
    config = parse('name: "ner" max_batch_size: 8 input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]')
    with pytest.raises(ConfigMismatchError) as info:
        autocomplete_config(config, bert())
    message = str(info.value)
    assert message.startswith(
        "input 'input_ids' of model 'ner': configuration says TYPE_INT64, the engine has TYPE_INT32"
    )
    assert "classic pitfall after an int32 export" in message
    assert "data_type: TYPE_INT32" in message
    assert (info.value.tensor, info.value.field) == ("input_ids", "data_type")


def test_another_datatype_mismatch_is_stated_without_the_int32_advice() -> None:
    config = parse('name: "m" output [ { name: "logits" data_type: TYPE_FP16 } ]')
    with pytest.raises(ConfigMismatchError) as info:
        autocomplete_config(config, bert())
    assert str(info.value) == "output 'logits' of model 'm': configuration says TYPE_FP16, the engine has TYPE_FP32"
    assert "pitfall" not in str(info.value)


def test_dims_of_another_rank_and_dims_that_no_profile_accepts() -> None:
    wrong_rank = parse('name: "m" max_batch_size: 8 input [ { name: "input_ids" dims: [ 4, 4 ] } ]')
    with pytest.raises(ConfigMismatchError) as info:
        autocomplete_config(wrong_rank, bert())
    assert (
        "input 'input_ids' of model 'm': configuration dims [-1] + [4, 4] do not match the engine's shape [-1, -1]"
        in (str(info.value))
    )
    too_long = parse('name: "m" max_batch_size: 4 input [ { name: "attention_mask" dims: [ 600 ] } ]')
    with pytest.raises(ConfigMismatchError) as info:
        autocomplete_config(too_long, bert())
    assert str(info.value).startswith(
        "input 'attention_mask' of model 'm': configuration dims [-1, 600] fit none of the engine's optimization "
        "profiles (profile 0: [1, 1]..[32, 512]; profile 1: [1, 1]..[4, 128])"
    )
    assert (info.value.tensor, info.value.field) == ("attention_mask", "dims")
    fits_one = parse('name: "m" max_batch_size: 4 input [ { name: "attention_mask" dims: [ 512 ] } ]')
    autocomplete_config(fits_one, bert())  # profile 0 takes 512 tokens


def test_a_tensor_the_engine_lacks_and_a_type_modelsvc_cannot_serve() -> None:
    with pytest.raises(
        ConfigMismatchError, match=r"'token_type_ids' is not an input of the engine of model 'm'"
    ) as info:
        autocomplete_config(parse('name: "m" input [ { name: "token_type_ids" } ]'), bert())
    assert "(the engine's inputs: input_ids, attention_mask)" in str(info.value)
    assert config_datatype("FP8") == "FP8"
    assert config_datatype("HALF") == "TYPE_FP16"
    fp8 = EngineDescription(
        (EngineTensor("x", True, "FP8", (2,)), EngineTensor("y", False, "TYPE_FP32", (2,))), (), "10"
    )
    with pytest.raises(ConfigMismatchError, match=r"input 'x' of model 'm': the engine has TensorRT type FP8"):
        autocomplete_config(parse('name: "m"'), fp8)


def test_check_config_without_autocomplete() -> None:
    complete = parse(
        'name: "m" max_batch_size: 8 '
        'input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }, '
        '{ name: "attention_mask" data_type: TYPE_INT32 dims: [ -1 ] } ] '
        'output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]'
    )
    check_config(complete, bert())
    missing = parse('name: "m" max_batch_size: 8 input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] } ]')
    with pytest.raises(ConfigMismatchError, match=r"does not list the engine's input\(s\) attention_mask"):
        check_config(missing, bert())
    int64 = parse(str(complete).replace("TYPE_INT32", "TYPE_INT64"))
    with pytest.raises(ConfigMismatchError, match="classic pitfall"):
        check_config(int64, bert("TYPE_INT32"))


# --- profiles of instances --------------------------------------------------------------------------------------


def places(group: str, gpus: list[int], count: int) -> list[Placement]:
    total = count * len(gpus)
    return [Placement(group, n, total, gpus[n // count]) for n in range(total)]


def test_instances_on_one_gpu_take_different_profiles_without_profile() -> None:
    config = parse('name: "m" instance_group [ { name: "g" kind: KIND_GPU count: 3 gpus: [ 0, 1 ] } ]')
    where = places("g", [0, 1], 3)
    assert choose_profiles(config, where, 2) == [0, 1, 0, 0, 1, 0]
    assert choose_profiles(config, where, 1) == [0] * 6


def test_instance_group_profile_picks_the_profiles() -> None:
    config = parse(
        'name: "m" instance_group [ { name: "a" kind: KIND_GPU count: 2 profile: [ "1" ] }, '
        '{ name: "b" kind: KIND_GPU count: 3 profile: [ "0", "2" ] } ]'
    )
    where = places("a", [0], 2) + places("b", [0], 3)
    assert choose_profiles(config, where, 3) == [1, 1, 0, 2, 0]
    with pytest.raises(ModelLoadError) as info:
        choose_profiles(config, where, 2)
    assert str(info.value) == (
        "instance group 'b' of model 'm': profile '2' is not an optimization profile of the engine (it has 2: 0..1)"
    )


# --- request time -----------------------------------------------------------------------------------------------


def test_a_request_shape_outside_the_profile_is_invalid_argument_naming_tensor_and_range() -> None:
    profile = bert().profiles[0]
    check_request_shapes("ner", 0, profile, {"input_ids": (32, 512), "attention_mask": (1, 1)})
    with pytest.raises(InvalidArgument) as info:
        check_request_shapes("ner", 0, profile, {"input_ids": (2, 8), "attention_mask": (40, 8)})
    assert str(info.value) == (
        "input 'attention_mask' of model 'ner' has shape [40, 8], outside the range of the engine's optimization "
        "profile 0: [1, 1]..[32, 512] (dimension 0 is 40, outside 1..32)"
    )
    with pytest.raises(InvalidArgument, match=r"\[1, 2, 3\].*\(it has 3 dimensions, the engine 2\)"):
        check_request_shapes("ner", 1, bert().profiles[1], {"input_ids": (1, 2, 3)})


class FakeEngine:
    """Stands in for PlanEngine: records what reaches it and adds 1 to every input as its output."""

    def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
        self.plan, self.device, self.profile = plan, device, profile
        self.description = bert()
        self.fed: list[Mapping[str, np.ndarray[Any, Any]]] = []
        self.closed = False
        OPENED.append(self)

    def infer(
        self, feeds: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        self.fed.append(feeds)
        ids = feeds["input_ids"]
        assert not outputs or list(outputs) == ["logits"]
        return {"logits": np.zeros((*ids.shape, 2), np.float32) + 1}

    def close(self) -> None:
        self.closed = True


OPENED: list[FakeEngine] = []


def test_nothing_reaches_the_engine_when_a_shape_is_outside_the_profile() -> None:
    engine = FakeEngine(b"plan", profile=1)
    instance = TensorRTInstance("ner_0", "ner", 0, 1, engine)
    assert (instance.device, instance.providers) == ("gpu:0", ["TensorRT 10.3.0", "profile 1"])
    long = np.zeros((1, 200), np.int32)
    with pytest.raises(InvalidArgument, match=r"'input_ids'.*profile 1: \[1, 1\]\.\.\[4, 128\]"):
        instance.execute({"input_ids": long, "attention_mask": long}, [])
    assert engine.fed == []
    short = np.zeros((2, 100), np.int32)
    out = instance.execute({"input_ids": short, "attention_mask": short}, ["logits"])
    assert out["logits"].shape == (2, 100, 2)
    assert len(engine.fed) == 1
    instance.close()
    assert engine.closed


def test_the_backend_places_instances_on_their_gpus_and_profiles(tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not a real plan")
    backend = TensorRTBackend(FakeEngine)
    config = parse('name: "ner" instance_group [ { name: "g" kind: KIND_GPU count: 2 gpus: [ 0, 3 ] } ]')
    backend.autocomplete(config, plan)
    assert config.max_batch_size == 32
    OPENED.clear()
    created = backend.create_instances(config, plan, 1)
    assert [(i.name, i.device, i.providers[1]) for i in created] == [
        ("g_0", "gpu:0", "profile 0"),
        ("g_1", "gpu:0", "profile 1"),
        ("g_2", "gpu:3", "profile 0"),
        ("g_3", "gpu:3", "profile 1"),
    ]
    assert len(OPENED) == 4  # the engine opened to check the config serves as the first instance
    assert all(e.plan == b"not a real plan" for e in OPENED)
    for instance in created:
        instance.close()
    cpu = parse('name: "ner" instance_group [ { name: "c" kind: KIND_CPU } ]')
    with pytest.raises(
        ModelLoadError, match="instance group 'c' of model 'ner' is KIND_CPU, but TensorRT plans run only"
    ):
        backend.create_instances(cpu, plan, 1)
    bad = parse(
        'name: "ner" max_batch_size: 8 input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }, '
        '{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ] '
        'output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1, 2 ] } ] instance_group [ { kind: KIND_GPU } ]'
    )
    OPENED.clear()
    with pytest.raises(ConfigMismatchError, match="classic pitfall"):
        backend.create_instances(bad, plan, 1)
    assert [e.closed for e in OPENED] == [True]


# --- deserialization --------------------------------------------------------------------------------------------


def test_the_deserialization_message_names_both_sides() -> None:
    log = [
        "IRuntime::deserializeCudaEngine: Error Code 6: API Usage Error (The engine plan file is not compatible "
        "with this version of TensorRT, expecting library version 10.3.0.26 got 8.6.1.6, please rebuild.)",
        "The engine plan file is generated on an incompatible device, expecting compute 8.9 got compute 8.0, "
        "please rebuild.",
    ]
    message = deserialize_failure_message(trt_version="10.3.0", device=1, compute_capability=(8, 9), log=log)
    assert "This server: TensorRT 10.3.0, GPU 1 of compute capability 8.9." in message
    assert "The plan: TensorRT 8.6.1.6, compute capability 8.0." in message
    assert "modelsvc build" in message
    assert "expecting library version" in message
    unknown = deserialize_failure_message(trt_version="10.3.0", device=0, compute_capability=None)
    assert "GPU 0 of compute capability unknown" in unknown
    assert "The plan: TensorRT unknown, compute capability unknown." in unknown
    tag = deserialize_failure_message(
        trt_version="10.3.0",
        device=0,
        compute_capability=(9, 0),
        log=["Serialization assertion failed. Current Version: 239, Serialized Engine Version: 236"],
        plan_compute_capability=(8, 6),
    )
    assert "The plan: TensorRT serialization tag 236 (this TensorRT has 239), compute capability 8.6." in tag


# --- without TensorRT -------------------------------------------------------------------------------------------


HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
PLAN_CONFIG = 'name: "plan"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'


def test_without_tensorrt_the_backend_names_the_extra() -> None:
    if HAS_TENSORRT:
        pytest.skip("TensorRT is installed here")
    with pytest.raises(ModelLoadError, match=r"backend 'tensorrt' needs TensorRT .*pip install 'modelsvc\[tensorrt\]'"):
        get_backend(parse('name: "plan" platform: "tensorrt_plan"'))


@pytest.mark.integration
def test_a_plan_model_without_tensorrt_is_unavailable_and_the_onnx_model_serves(tmp_path: Path) -> None:
    if HAS_TENSORRT:
        pytest.skip("TensorRT is installed here")
    (tmp_path / "plan" / "1").mkdir(parents=True)
    (tmp_path / "plan" / "1" / "model.plan").write_bytes(b"any bytes")
    (tmp_path / "plan" / "config.pbtxt").write_text(PLAN_CONFIG)
    om.write_model(tmp_path, "onnx", om.identity(), identity_config("onnx"))
    proc = ModelsvcProcess(tmp_path, "--exit-on-error", "false").start()
    try:

        def onnx_ready() -> bool:
            assert proc.proc is not None
            assert proc.proc.poll() is None, proc.log()
            try:
                return httpx.get(f"{proc.base}/v2/models/onnx/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(onnx_ready, "the ONNX model to load", timeout=90)
        index = {row["name"]: row for row in httpx.post(f"{proc.base}/v2/repository/index", timeout=10).json()}
        assert index["plan"]["state"] == "UNAVAILABLE"
        assert "modelsvc[tensorrt]" in index["plan"]["reason"]
        assert index["onnx"]["state"] == "READY"
        data = np.arange(32, dtype=np.float32).reshape(2, 16)
        with httpclient.InferenceServerClient(proc.url) as client:
            result = client.infer("onnx", [infer_input("INPUT0", data)])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
            assert not client.is_model_ready("plan")
    finally:
        proc.terminate()
