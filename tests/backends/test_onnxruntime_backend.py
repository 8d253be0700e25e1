"""The ONNX Runtime backend: auto-complete types, instances, providers and the GPU refusal, execution."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

import modelsvc.backends
from modelsvc.backends import ModelInstance, ModelLoadError, get_backend, visible_gpus
from modelsvc.backends.onnxruntime._onnxruntime import OnnxRuntimeBackend
from modelsvc.backends.onnxruntime._onnxruntime_options import _gpu_providers
from modelsvc.protocol import CONFIG_TO_WIRE, ONNX_TO_CONFIG, WIRE_TO_CONFIG, InvalidArgument
from modelsvc.repository import ModelRepository, ModelSource
from modelsvc.tools.onnx_models import add_sub, identity, token_classifier, write_model
from tests.conftest import DTYPES

GPU_GROUP = "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n"
ALLOW_FALLBACK = 'parameters { key: "allow_cpu_fallback" value { string_value: "true" } }\n'
no_gpu = pytest.mark.skipif(bool(visible_gpus()), reason="checks the refusal on a machine without a GPU")


def source(repo: Path, name: str, model: Any, config: str | None) -> ModelSource:
    write_model(repo, name, model, config)
    return ModelRepository(repo, gpus=()).load(name)


def instances(src: ModelSource) -> list[ModelInstance]:
    version = src.versions[-1]
    return get_backend(src.config).create_instances(src.config, src.artifact(version), version)


def one_instance(repo: Path, name: str, model: Any, config: str | None = None) -> ModelInstance:
    instance = instances(source(repo, name, model, config))[0]
    return instance


def test_exports_are_sorted_and_complete() -> None:
    names = modelsvc.backends.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    for name in names:
        assert hasattr(modelsvc.backends, name)


def test_type_map_covers_every_config_type() -> None:
    assert set(ONNX_TO_CONFIG.values()) == set(CONFIG_TO_WIRE)


@pytest.mark.parametrize("datatype", DTYPES)
def test_autocomplete_datatypes(tmp_path: Path, datatype: str) -> None:
    config = source(tmp_path, "m", identity(datatype), None).config
    assert config.input[0].data_type == config.output[0].data_type
    assert (
        type(config)
        .DESCRIPTOR.fields_by_name["input"]
        .message_type.fields_by_name["data_type"]
        .enum_type.values_by_number[config.input[0].data_type]
        .name
        == WIRE_TO_CONFIG[datatype]
    )


# --- execution ----------------------------------------------------------------------------------------


def test_identity_fp32(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "ident", identity())
    assert (instance.name, instance.device, instance.providers) == ("ident_0", "cpu", ["CPUExecutionProvider"])
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    out = instance.execute({"INPUT0": x}, ["OUTPUT0"])
    assert list(out) == ["OUTPUT0"]
    np.testing.assert_array_equal(out["OUTPUT0"], x)
    instance.close()


def test_identity_fp16(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "ident16", identity("FP16"))
    x = np.linspace(-2, 2, 32, dtype=np.float16).reshape(2, 16)
    out = instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, x)


def test_identity_bytes_round_trip(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "strings", identity("BYTES", ["batch", 3]))
    x = np.array([[b"hello", "é".encode(), b""], [b"a b", b"\x00z", b"\xe2\x82\xac"]], dtype=np.object_)
    out = instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.object_
    assert out.shape == (2, 3)
    assert out.tolist() == x.tolist()
    assert all(isinstance(v, bytes) for v in out.reshape(-1))


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "strings", identity("BYTES", ["batch", 1]))
    with pytest.raises(InvalidArgument, match="UTF-8"):
        instance.execute({"INPUT0": np.array([[b"\xff"]], dtype=np.object_)}, ["OUTPUT0"])


def test_add_sub(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "add_sub", add_sub())
    a = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    out = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
    only = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    assert list(only) == ["OUTPUT1"]
    assert list(instance.execute({"INPUT0": a, "INPUT1": b}, [])) == ["OUTPUT0", "OUTPUT1"]


def test_token_classifier_matches_numpy(tmp_path: Path) -> None:
    model = token_classifier(vocab=50, hidden=8, labels=3)
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    instance = one_instance(tmp_path, "tc", model)
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=np.int64)
    logits = instance.execute({"input_ids": ids, "attention_mask": mask}, ["logits"])["logits"]
    hidden = weights["emb"][ids] * mask[..., None]
    pooled = hidden.sum(axis=1) / mask.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(logits, pooled @ weights["head_w"] + weights["head_b"], rtol=1e-5, atol=1e-6)


def test_token_classifier_with_layers_runs(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "tc", token_classifier(layers=2))
    ids = np.ones((3, 7), dtype=np.int64)
    logits = instance.execute({"input_ids": ids, "attention_mask": ids}, ["logits"])["logits"]
    assert logits.shape == (3, 4)
    assert logits.dtype == np.float32


def test_wrong_input_dtype_is_invalid_argument(tmp_path: Path) -> None:
    instance = one_instance(tmp_path, "ident", identity())
    with pytest.raises(InvalidArgument, match="onnx runtime error"):
        instance.execute({"INPUT0": np.zeros((1, 16), dtype=np.float64)}, ["OUTPUT0"])


# --- instances and providers --------------------------------------------------------------------------


def test_instance_names_follow_triton(tmp_path: Path) -> None:
    config = (
        "instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_CPU },\n"
        '  { name: "extra" count: 1 kind: KIND_CPU } ]'
    )
    created = instances(source(tmp_path, "ident", identity(), config))
    # the middle group has no count: 2 instances, as Triton gives KIND_CPU onnxruntime groups
    assert [i.name for i in created] == ["ident_0_0", "ident_0_1", "ident_1_0", "ident_1_1", "extra"]
    assert all(i.device == "cpu" for i in created)


def test_session_parameters(tmp_path: Path) -> None:
    config = (
        'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
        'parameters { key: "inter_op_thread_count" value { string_value: "1" } }\n'
        'parameters { key: "execution_mode" value { string_value: "1" } }\n'
        'parameters { key: "enable_mem_arena" value { string_value: "1" } }\n'
        'parameters { key: "allow_spinning" value { string_value: "true" } }\n'
        'parameters { key: "memory.enable_memory_arena_shrinkage" value { string_value: "cpu:0" } }\n'
        "optimization { graph { level: 1 } }\n"
    )
    instance = one_instance(tmp_path, "ident", identity(), config)
    x = np.ones((2, 16), dtype=np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ('parameters { key: "execution_mode" value { string_value: "2" } }', "execution_mode"),
        ('parameters { key: "intra_op_thread_count" value { string_value: "many" } }', "integer"),
        ('parameters { key: "allow_cpu_fallback" value { string_value: "maybe" } }', "true/false"),
        (
            'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "dnnl" } ] } }',
            "unknown cpu_execution_accelerator 'dnnl'",
        ),
        (
            GPU_GROUP + 'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "rocm" } ] } }',
            "unknown gpu_execution_accelerator 'rocm'",
        ),
    ],
)
def test_bad_backend_settings_are_refused(tmp_path: Path, config: str, fragment: str) -> None:
    src = source(tmp_path, "ident", identity(), config)
    with pytest.raises(ModelLoadError, match=fragment):
        instances(src)


def test_missing_artifact(tmp_path: Path) -> None:
    src = source(tmp_path, "ident", identity(), None)
    src.artifact(1).unlink()
    with pytest.raises(ModelLoadError, match="unable to find"):
        instances(src)


def test_strict_config_that_disagrees_with_the_model_fails_at_load(tmp_path: Path) -> None:
    config = """
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """
    write_model(tmp_path, "ident", identity(), config)
    src = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("ident")
    with pytest.raises(ModelLoadError, match="TYPE_INT32, the model has TYPE_FP32"):
        instances(src)


@no_gpu
def test_kind_gpu_without_gpu_is_refused(tmp_path: Path) -> None:
    src = source(tmp_path, "ident", identity(), GPU_GROUP)
    with pytest.raises(ModelLoadError, match=r"asked for KIND_GPU .* CUDA provider is unavailable.*silent"):
        instances(src)


@no_gpu
def test_kind_gpu_with_allow_cpu_fallback_runs_on_cpu(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = source(tmp_path, "ident", identity(), GPU_GROUP + ALLOW_FALLBACK)
    with caplog.at_level(logging.WARNING, logger="modelsvc.backends.onnxruntime"):
        [instance] = instances(src)
    assert (instance.device, instance.providers) == ("cpu", ["CPUExecutionProvider"])
    assert any("allow_cpu_fallback" in r.getMessage() for r in caplog.records)
    x = np.ones((1, 16), dtype=np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)


def test_tensorrt_accelerator_options() -> None:
    backend_config = source_config(
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt"\n'
        '  parameters { key: "precision_mode" value: "FP16" }\n'
        '  parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }'
    )
    providers, wants_trt = _gpu_providers(backend_config, 1)
    assert wants_trt
    assert providers == [
        (
            "TensorrtExecutionProvider",
            {"trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824", "device_id": "1"},
        ),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        "CPUExecutionProvider",
    ]
    int8 = source_config(
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt"\n'
        '  parameters { key: "precision_mode" value: "INT8" } } ] } }'
    )
    assert _gpu_providers(int8, 0)[0][0] == (
        "TensorrtExecutionProvider",
        {"trt_int8_enable": "1", "device_id": "0"},
    )
    with pytest.raises(ModelLoadError, match="precision_mode 'FP8'"):
        _gpu_providers(
            source_config(
                "optimization { execution_accelerators { gpu_execution_accelerator [ { name: "
                '"tensorrt" parameters { key: "precision_mode" value: "FP8" } } ] } }'
            ),
            0,
        )


def source_config(text: str) -> Any:
    from google.protobuf import text_format

    from modelsvc.backends import ModelConfig

    return text_format.Parse(text, ModelConfig())


def test_backend_name_and_default_batch_size() -> None:
    backend = OnnxRuntimeBackend()
    assert backend.name == "onnxruntime"
    assert backend.default_max_batch_size == 4


def test_config_without_instance_group_gets_one_instance(tmp_path: Path) -> None:
    src = source(tmp_path, "ident", identity(), None)
    del src.config.instance_group[:]
    created = get_backend(src.config).create_instances(src.config, src.artifact(1), 1)
    assert [i.name for i in created] == ["ident"]
