"""ONNX Runtime on GPUs: Triton's gpu_execution_accelerator keys mapped onto ONNX Runtime's TensorRT and CUDA
provider options (a pure function: every key, every error text), the checks at load on any machine, a real
server, and (``-m gpu``, skipped without a GPU) the options that ONNX Runtime really applies."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from modelsvc.backends import ModelConfig, ModelLoadError, get_backend, visible_gpus
from modelsvc.backends.onnxruntime._onnxruntime_gpu import (
    CPU,
    CUDA,
    CUDA_KEYS,
    CUDA_MODEL_PARAMETERS,
    TRT,
    TRT_KEYS,
    GpuAccelerators,
    gpu_accelerators,
    parse_shapes,
    providers,
)
from modelsvc.backends.onnxruntime._onnxruntime_instance import OnnxRuntimeInstance
from modelsvc.repository import ModelRepository
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config, infer_input

#: the keys of Triton's ONNX Runtime backend for its tensorrt accelerator (its README's mapping table)
TRITON_TRT_KEYS = {
    "precision_mode", "max_workspace_size_bytes", "trt_max_partition_iterations", "trt_min_subgraph_size",
    "int8_calibration_table_name", "int8_use_native_calibration_table", "trt_dla_enable", "trt_dla_core",
    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
    "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
    "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level",
    "trt_auxiliary_streams", "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
    "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model",
    "trt_ep_context_file_path", "trt_ep_context_embed_mode",
}  # fmt: skip

# (Triton key, value given, TensorRT provider option, value passed, kind of value)
TRT_GOOD = [
    ("max_workspace_size_bytes", "4294967296", "trt_max_workspace_size", "4294967296", "bytes"),
    ("trt_max_partition_iterations", "1000", "trt_max_partition_iterations", "1000", "int>=1"),
    ("trt_min_subgraph_size", "1", "trt_min_subgraph_size", "1", "int>=1"),
    ("int8_calibration_table_name", "calib.cache", "trt_int8_calibration_table_name", "calib.cache", "text"),
    ("int8_use_native_calibration_table", "true", "trt_int8_use_native_calibration_table", "1", "flag"),
    ("trt_dla_enable", "0", "trt_dla_enable", "0", "flag"),
    ("trt_dla_core", "1", "trt_dla_core", "1", "int>=0"),
    ("trt_engine_cache_enable", "1", "trt_engine_cache_enable", "1", "flag"),
    ("trt_engine_cache_path", "/var/cache/trt", "trt_engine_cache_path", "/var/cache/trt", "text"),
    ("trt_engine_cache_prefix", "minilm", "trt_engine_cache_prefix", "minilm", "text"),
    ("trt_dump_subgraphs", "false", "trt_dump_subgraphs", "0", "flag"),
    ("trt_force_sequential_engine_build", "on", "trt_force_sequential_engine_build", "1", "flag"),
    ("trt_context_memory_sharing_enable", "1", "trt_context_memory_sharing_enable", "1", "flag"),
    ("trt_layer_norm_fp32_fallback", "True", "trt_layer_norm_fp32_fallback", "1", "flag"),
    ("trt_timing_cache_enable", "yes", "trt_timing_cache_enable", "1", "flag"),
    ("trt_timing_cache_path", "/var/cache/timing", "trt_timing_cache_path", "/var/cache/timing", "text"),
    ("trt_force_timing_cache", "no", "trt_force_timing_cache", "0", "flag"),
    ("trt_detailed_build_log", "1", "trt_detailed_build_log", "1", "flag"),
    ("trt_build_heuristics_enable", "1", "trt_build_heuristics_enable", "1", "flag"),
    ("trt_sparsity_enable", "off", "trt_sparsity_enable", "0", "flag"),
    ("trt_builder_optimization_level", "3", "trt_builder_optimization_level", "3", "level"),
    ("trt_auxiliary_streams", "-1", "trt_auxiliary_streams", "-1", "int>=-1"),
    ("trt_tactic_sources", "-CUDNN, +CUBLAS", "trt_tactic_sources", "-CUDNN,+CUBLAS", "tactics"),
    ("trt_extra_plugin_lib_paths", "/opt/libx.so", "trt_extra_plugin_lib_paths", "/opt/libx.so", "text"),
    ("trt_cuda_graph_enable", "1", "trt_cuda_graph_enable", "1", "flag"),
    ("trt_dump_ep_context_model", "1", "trt_dump_ep_context_model", "1", "flag"),
    ("trt_ep_context_file_path", "/tmp/ctx.onnx", "trt_ep_context_file_path", "/tmp/ctx.onnx", "text"),
    ("trt_ep_context_embed_mode", "1", "trt_ep_context_embed_mode", "1", "mode"),
]  # fmt: skip
PROFILE_KEYS = {"trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"}

# (CUDA key, value given, value passed, kind of value)
CUDA_FLAGS = (
    "do_copy_in_default_stream", "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph",
    "enable_skip_layer_norm_strict_mode", "prefer_nhwc", "use_ep_level_unified_stream", "use_tf32",
    "tunable_op_enable", "tunable_op_tuning_enable", "fuse_conv_bias",
)  # fmt: skip
CUDA_GOOD = [
    ("gpu_mem_limit", "2147483648", "2147483648", "bytes"),
    ("arena_extend_strategy", "1", "kSameAsRequested", "arena"),
    ("cudnn_conv_algo_search", "HEURISTIC", "HEURISTIC", "algo"),
    ("tunable_op_max_tuning_duration_ms", "500", "500", "int>=0"),
    ("sdpa_kernel", "2", "2", "int>=0"),
    *((key, *(("true", "1"), ("0", "0"))[i % 2], "flag") for i, key in enumerate(CUDA_FLAGS)),
]

# kind of value -> (a bad value, what the error says)
BAD = {
    "bytes": ("1GB", "must be a number of bytes (an integer such as 1073741824)"),
    "int>=1": ("0", "must be an integer of at least 1"),
    "int>=0": ("-1", "must be an integer of at least 0"),
    "int>=-1": ("many", "must be an integer of at least -1"),
    "level": ("6", "must be an integer from 0 to 5"),
    "mode": ("2", "must be an integer from 0 to 1"),
    "flag": ("maybe", "must be true or false (1 or 0)"),
    "text": ("", "must not be empty"),
    "tactics": ("CUDNN", "must list tactic sources each with + or -, such as '-CUDNN,+CUBLAS'"),
    "arena": ("2", "must be one of 0 (kNextPowerOfTwo), 1 (kSameAsRequested)"),
    "algo": ("FAST", "must be one of 0 (EXHAUSTIVE), 1 (HEURISTIC), 2 (DEFAULT)"),
}


def parse(text: str) -> ModelConfig:
    return text_format.Parse('name: "m"\n' + text, ModelConfig())


def accelerator(name: str, **params: str) -> str:
    items = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in params.items())
    return f'{{ name: "{name}" {items} }}'


def accelerators(*entries: str, extra: str = "") -> str:
    return (
        f"optimization {{ execution_accelerators {{ gpu_execution_accelerator [ {', '.join(entries)} ] }} }}\n{extra}"
    )


def mapped(*entries: str, extra: str = "") -> GpuAccelerators:
    return gpu_accelerators(parse(accelerators(*entries, extra=extra)))


def model_parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'


# --- the tensorrt accelerator ---------------------------------------------------------------------------


def test_keys_are_tritons_and_every_one_is_tested() -> None:
    assert set(TRT_KEYS) == TRITON_TRT_KEYS
    assert {row[0] for row in TRT_GOOD} | PROFILE_KEYS | {"precision_mode"} == TRITON_TRT_KEYS
    assert {row[0] for row in CUDA_GOOD} == set(CUDA_KEYS)
    assert set(CUDA_MODEL_PARAMETERS) <= set(CUDA_KEYS)
    readme = (Path(__file__).parents[2] / "README.md").read_text().split("ONNX Runtime: `KIND_CPU`")[1].split("\n- ")[0]
    assert [key for key in (*TRT_KEYS, *CUDA_KEYS) if f"`{key}`" not in readme] == []


KEY_CASES = [("tensorrt", key, given, {option: passed}, kind) for key, given, option, passed, kind in TRT_GOOD] + [
    ("cuda", key, given, {key: passed}, kind) for key, given, passed, kind in CUDA_GOOD
]
KEY_IDS = [f"{case[0]}-{case[1]}" for case in KEY_CASES]


@pytest.mark.parametrize(("name", "key", "given", "options", "kind"), KEY_CASES, ids=KEY_IDS)
def test_every_key_maps_to_its_provider_option(
    name: str, key: str, given: str, options: dict[str, str], kind: str
) -> None:
    expected = GpuAccelerators(tensorrt=options) if name == "tensorrt" else GpuAccelerators(cuda=options)
    assert mapped(accelerator(name, **{key: given})) == expected


@pytest.mark.parametrize(("name", "key", "given", "options", "kind"), KEY_CASES, ids=KEY_IDS)
def test_every_key_with_a_bad_value_names_model_accelerator_and_key(
    name: str, key: str, given: str, options: dict[str, str], kind: str
) -> None:
    bad, says = BAD[kind]
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator(name, **{key: bad}))
    assert str(info.value) == f"model 'm', gpu_execution_accelerator '{name}': parameter '{key}' {says}, got '{bad}'"


def test_precision_modes() -> None:
    for mode, flags in {"FP32": {}, "FP16": {"trt_fp16_enable": "1"}, "BF16": {"trt_bf16_enable": "1"}}.items():
        assert mapped(accelerator("tensorrt", precision_mode=mode)).tensorrt == flags
    assert mapped(accelerator("tensorrt", precision_mode="INT8")).tensorrt == {"trt_int8_enable": "1"}


@pytest.mark.parametrize("mode", ["FP8", "fp16", "", "TF32"])
def test_a_precision_mode_that_is_not_one_is_refused(mode: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator("tensorrt", precision_mode=mode))
    assert str(info.value) == (
        "model 'm', gpu_execution_accelerator 'tensorrt': parameter 'precision_mode': unsupported "
        f"precision_mode '{mode}' (FP32, FP16, BF16 or INT8, in capitals)"
    )


def test_int8_with_its_calibration_table_and_the_whole_example_of_tritons_readme() -> None:
    got = mapped(accelerator(
        "tensorrt", precision_mode="INT8", int8_calibration_table_name="calibration.flatbuffers",
        int8_use_native_calibration_table="0", max_workspace_size_bytes="1073741824", trt_engine_cache_enable="1",
        trt_engine_cache_path="/tmp/cache",
    ))  # fmt: skip
    assert got.tensorrt == {
        "trt_int8_enable": "1",
        "trt_int8_calibration_table_name": "calibration.flatbuffers",
        "trt_int8_use_native_calibration_table": "0",
        "trt_max_workspace_size": "1073741824",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/tmp/cache",
    }


@pytest.mark.parametrize(
    ("name", "key", "advice"),
    [
        ("tensorrt", "precision_mod", "did you mean 'precision_mode'?"),
        ("tensorrt", "trt_engine_cache_enabled", "did you mean 'trt_engine_cache_enable'?"),
        ("tensorrt", "trt_fp16_enable", "use precision_mode FP16"),
        ("tensorrt", "trt_bf16_enable", "use precision_mode BF16"),
        ("tensorrt", "trt_int8_enable", "use precision_mode INT8"),
        ("tensorrt", "trt_max_workspace_size", "use max_workspace_size_bytes"),
        ("tensorrt", "trt_int8_calibration_table_name", "use int8_calibration_table_name"),
        ("tensorrt", "trt_int8_use_native_calibration_table", "use int8_use_native_calibration_table"),
        ("tensorrt", "minimum_segment_size", "TensorFlow-TensorRT's name; use trt_min_subgraph_size"),
        ("tensorrt", "max_partition_iterations", "use trt_max_partition_iterations"),
        ("tensorrt", "max_cached_engines", "ONNX Runtime caches engines with trt_engine_cache_enable"),
        ("tensorrt", "device_id", "the GPU is the instance's, from instance_group { kind: KIND_GPU gpus: [...] }"),
        ("tensorrt", "zzz", "its keys: precision_mode, max_workspace_size_bytes, trt_max_partition_iterations"),
        ("cuda", "cudnn_conv_algo", "did you mean 'cudnn_conv_algo_search'?"),
        ("cuda", "cuda_mem_limit", "use gpu_mem_limit"),
        ("cuda", "device_id", "from instance_group"),
        ("cuda", "user_compute_stream", "it takes a pointer, which a model config cannot hold"),
        ("cuda", "gpu_external_alloc", "it takes a pointer"),
        ("cuda", "zzz", "its keys: gpu_mem_limit, arena_extend_strategy"),
    ],
)
def test_an_unknown_key_is_refused_with_advice(name: str, key: str, advice: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator(name, **{key: "1"}))
    message = str(info.value)
    assert message.startswith(f"model 'm', gpu_execution_accelerator '{name}': unknown parameter '{key}' (")
    assert advice in message


def test_an_unknown_accelerator_and_a_second_tensorrt_are_refused() -> None:
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator("rocm"))
    assert str(info.value) == (
        "model 'm': unknown gpu_execution_accelerator 'rocm' (the ONNX Runtime backend has 'tensorrt' and 'cuda')"
    )
    with pytest.raises(ModelLoadError, match="model 'm': gpu_execution_accelerator 'tensorrt' is listed twice"):
        mapped(accelerator("tensorrt"), accelerator("tensorrt", precision_mode="FP16"))


def test_values_are_stripped_and_no_accelerator_means_defaults() -> None:
    assert mapped(accelerator("tensorrt", trt_dla_core=" 2 ")).tensorrt == {"trt_dla_core": "2"}
    assert gpu_accelerators(parse("")) == GpuAccelerators(tensorrt=None, cuda={})
    assert mapped(accelerator("tensorrt")) == GpuAccelerators(tensorrt={}, cuda={})


# --- profile shapes ---------------------------------------------------------------------------------------


def profile(low: str, opt: str, high: str) -> GpuAccelerators:
    return mapped(
        accelerator("tensorrt", trt_profile_min_shapes=low, trt_profile_opt_shapes=opt, trt_profile_max_shapes=high)
    )


def test_profile_shapes_go_through_normalized() -> None:
    got = profile("ids:1x1, mask:1x1", "ids:8x128,mask:8x128", "ids:64x512,mask:64x512")
    assert got.tensorrt == {
        "trt_profile_min_shapes": "ids:1x1,mask:1x1",
        "trt_profile_opt_shapes": "ids:8x128,mask:8x128",
        "trt_profile_max_shapes": "ids:64x512,mask:64x512",
    }
    # a name given again opens a second profile; inputs may come in any order
    two = profile("ids:1x1,ids:9x1", "ids:4x64,ids:16x64", "ids:8x128,ids:32x512")
    assert two.tensorrt is not None
    assert two.tensorrt["trt_profile_max_shapes"] == "ids:8x128,ids:32x512"
    assert parse_shapes("a:1x2,b:3") == [("a", (1, 2)), ("b", (3,))]
    assert parse_shapes("scope/in:0:1x2") == [("scope/in:0", (1, 2))]


@pytest.mark.parametrize(
    ("low", "opt", "high", "says"),
    [
        ("ids:1x1", "ids:8x128", "ids:4x512", "input 'ids' need min <= opt <= max in every dimension, got min 1x1"),
        ("ids:1x1", "ids:8x128x1", "ids:64x512", "the profile shapes of input 'ids' differ in rank"),
        ("ids:1x1", "mask:8x128", "ids:64x512", "must name the same inputs as often"),
        ("ids:1x1,ids:2x1", "ids:8x128", "ids:64x512", "got min ids x2; opt ids x1; max ids x1"),
    ],
)
def test_bad_profile_shapes(low: str, opt: str, high: str, says: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        profile(low, opt, high)
    assert str(info.value).startswith("model 'm', gpu_execution_accelerator 'tensorrt': ")
    assert says in str(info.value)


@pytest.mark.parametrize("value", ["ids", "ids:", ":1x2", "ids:axb", "ids:1x-2", "ids:1x2,"])
def test_profile_shapes_that_do_not_parse(value: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator("tensorrt", trt_profile_min_shapes=value))
    assert "parameter 'trt_profile_min_shapes' must be shapes such as 'input_ids:1x128,attention_mask:1x128'" in str(
        info.value
    )


def test_profile_shapes_go_together() -> None:
    with pytest.raises(ModelLoadError) as info:
        mapped(accelerator("tensorrt", trt_profile_min_shapes="ids:1x1"))
    assert str(info.value) == (
        "model 'm', gpu_execution_accelerator 'tensorrt': trt_profile_min_shapes, trt_profile_opt_shapes and "
        "trt_profile_max_shapes go together; trt_profile_opt_shapes and trt_profile_max_shapes missing"
    )


# --- the cuda accelerator and the CUDA parameters ---------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "given", "passed"),
    [
        ("cudnn_conv_algo_search", "0", "EXHAUSTIVE"),
        ("cudnn_conv_algo_search", "1", "HEURISTIC"),
        ("cudnn_conv_algo_search", "2", "DEFAULT"),
        ("arena_extend_strategy", "0", "kNextPowerOfTwo"),
        ("arena_extend_strategy", "kSameAsRequested", "kSameAsRequested"),
        ("gpu_mem_limit", "4294967200", "4294967200"),
        ("do_copy_in_default_stream", "0", "0"),
    ],
)
def test_tritons_cuda_model_parameters(key: str, given: str, passed: str) -> None:
    assert gpu_accelerators(parse(model_parameter(key, given))).cuda == {key: passed}


def test_cuda_model_parameters_are_checked_and_agree_with_the_accelerator() -> None:
    with pytest.raises(ModelLoadError) as info:
        gpu_accelerators(parse(model_parameter("cudnn_conv_algo_search", "3")))
    assert str(info.value) == (
        "model 'm', parameters (read for the CUDA execution provider): parameter 'cudnn_conv_algo_search' must be "
        "one of 0 (EXHAUSTIVE), 1 (HEURISTIC), 2 (DEFAULT), got '3'"
    )
    same = mapped(accelerator("cuda", gpu_mem_limit="1024"), extra=model_parameter("gpu_mem_limit", "1024"))
    assert same.cuda == {"gpu_mem_limit": "1024"}
    with pytest.raises(ModelLoadError) as info:
        mapped(
            accelerator("cuda", cudnn_conv_algo_search="DEFAULT"), extra=model_parameter("cudnn_conv_algo_search", "1")
        )
    assert str(info.value) == (
        "model 'm': parameter 'cudnn_conv_algo_search' is 'HEURISTIC' in parameters but 'DEFAULT' in "
        "gpu_execution_accelerator 'cuda'; set it in one place"
    )
    # other model parameters are not the CUDA provider's
    assert gpu_accelerators(parse(model_parameter("intra_op_thread_count", "2"))).cuda == {}


def test_two_cuda_entries_merge_unless_they_disagree() -> None:
    got = mapped(accelerator("cuda", use_tf32="0"), accelerator("cuda", prefer_nhwc="1"))
    assert got.cuda == {"use_tf32": "0", "prefer_nhwc": "1"}
    with pytest.raises(ModelLoadError, match="parameter 'use_tf32' is given twice, as '0' and '1'"):
        mapped(accelerator("cuda", use_tf32="0"), accelerator("cuda", use_tf32="1"))


# --- providers -----------------------------------------------------------------------------------------------


def test_providers_put_tensorrt_first_and_the_instance_gpu_in_each() -> None:
    both = mapped(accelerator("tensorrt", precision_mode="FP16"), accelerator("cuda", use_tf32="0"))
    assert providers(both, 3) == [
        (TRT, {"trt_fp16_enable": "1", "device_id": "3"}),
        (CUDA, {"use_tf32": "0", "device_id": "3"}),
        CPU,
    ]
    assert providers(GpuAccelerators(), 0) == [(CUDA, {"device_id": "0"}), CPU]


# --- in the backend: checked for every instance kind ---------------------------------------------------------


def create(repo: Path, name: str, config: str) -> list[Any]:
    om.write_model(repo, name, om.identity(), identity_config(name, extra=config))
    src = ModelRepository(repo, gpus=()).load(name)
    return get_backend(src.config).create_instances(src.config, src.artifact(1), 1)


def test_a_cpu_model_with_a_bad_accelerator_key_fails_to_load(tmp_path: Path) -> None:
    config = "instance_group [ { kind: KIND_CPU } ]\n" + accelerators(accelerator("tensorrt", precision_mod="FP16"))
    with pytest.raises(ModelLoadError, match="model 'cpu', gpu_execution_accelerator 'tensorrt': unknown parameter"):
        create(tmp_path, "cpu", config)


def test_a_cpu_instance_ignores_good_gpu_accelerators(tmp_path: Path) -> None:
    config = "instance_group [ { kind: KIND_CPU count: 1 } ]\n" + accelerators(
        accelerator("tensorrt", precision_mode="FP16"), accelerator("cuda", use_tf32="0")
    )
    [instance] = create(tmp_path, "cpu", config)
    assert (instance.device, instance.providers) == ("cpu", [CPU])
    assert instance.provider_options() == {CPU: {}}
    x = np.ones((2, 16), np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)


# --- through a real server -----------------------------------------------------------------------------------

FALLBACK = model_parameter("allow_cpu_fallback", "true")
GPU_ACCELERATORS = accelerators(
    accelerator("tensorrt", precision_mode="FP16", max_workspace_size_bytes="1073741824"),
    accelerator("cuda", cudnn_conv_algo_search="HEURISTIC", use_tf32="0"),
)


def _index(proc: ModelsvcProcess, names: set[str]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        try:
            rows = {r["name"]: r for r in httpx.post(f"{proc.base}/v2/repository/index", timeout=10).json()}
            if names <= rows.keys() and all(rows[n].get("state") in ("READY", "UNAVAILABLE") for n in names):
                return rows
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.05)


@pytest.mark.integration
def test_server_refuses_a_bad_key_serves_the_rest_and_reports_the_provider_in_use(tmp_path: Path) -> None:
    bad = "instance_group [ { kind: KIND_CPU } ]\n" + accelerators(
        accelerator("tensorrt", max_workspace_size_bytes="1GB")
    )
    gpu = "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n" + GPU_ACCELERATORS + FALLBACK
    om.write_model(tmp_path, "bad_key", om.identity(), identity_config("bad_key", extra=bad))
    om.write_model(tmp_path, "good", om.identity(), identity_config("good"))
    om.write_model(tmp_path, "gpu_fallback", om.identity(), identity_config("gpu_fallback", extra=gpu))
    proc = ModelsvcProcess(tmp_path, "--exit-on-error", "false").start()
    try:
        rows = _index(proc, {"bad_key", "good", "gpu_fallback"})
        assert rows["bad_key"]["state"] == "UNAVAILABLE"
        assert (
            "model 'bad_key', gpu_execution_accelerator 'tensorrt': parameter 'max_workspace_size_bytes' must be a "
            "number of bytes (an integer such as 1073741824), got '1GB'" in rows["bad_key"]["reason"]
        )
        assert rows["good"]["state"] == rows["gpu_fallback"]["state"] == "READY"
        client = httpclient.InferenceServerClient(proc.url)
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        for name in ("good", "gpu_fallback"):
            np.testing.assert_array_equal(client.infer(name, [infer_input("INPUT0", x)]).as_numpy("OUTPUT0"), x)
        client.close()
        metrics = httpx.get(proc.metrics_url, timeout=10).text
        line = [
            m for m in metrics.splitlines() if m.startswith('modelsvc_model_execution_provider{model="gpu_fallback"')
        ]
        expected = {TRT, CUDA} if visible_gpus() else {CPU}
        assert len(line) == 1, metrics
        assert line[0].endswith(" 1.0"), line
        assert line[0].split('provider="')[1].split('"')[0] in expected, line
    finally:
        proc.terminate()


# --- on a GPU: ONNX Runtime really applies the options -------------------------------------------------------


def _gpu_instance(tmp_path: Path, config: str) -> OnnxRuntimeInstance:
    if not visible_gpus():
        pytest.skip("no NVIDIA GPU visible to this process")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("ONNX Runtime here is a build without the CUDA provider (pip install onnxruntime-gpu)")
    try:
        [instance] = create(tmp_path, "on_gpu", "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n" + config)
    except ModelLoadError as exc:  # the GPU build whose CUDA libraries did not load: session.get_providers() says so
        if "CUDA provider is unavailable" not in str(exc):
            raise
        pytest.skip(f"ONNX Runtime's CUDA provider did not load here (its CUDA or cuDNN libraries are missing): {exc}")
    assert isinstance(instance, OnnxRuntimeInstance)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)
    return instance


@pytest.mark.gpu
def test_cuda_provider_options_are_applied_on_a_gpu(tmp_path: Path) -> None:
    config = accelerators(
        accelerator("cuda", cudnn_conv_algo_search="HEURISTIC", arena_extend_strategy="1", use_tf32="0"),
        extra=model_parameter("gpu_mem_limit", "2147483648"),
    )
    instance = _gpu_instance(tmp_path, config)
    assert (instance.device, instance.providers[0]) == ("gpu:0", CUDA)
    applied = instance.provider_options()[CUDA]
    assert applied["device_id"] == "0"
    assert applied["cudnn_conv_algo_search"] == "HEURISTIC"
    assert applied["arena_extend_strategy"] == "kSameAsRequested"
    assert applied["gpu_mem_limit"] == "2147483648"
    assert applied["use_tf32"] == "0"


@pytest.mark.gpu
def test_tensorrt_provider_options_are_applied_on_a_gpu(tmp_path: Path) -> None:
    if visible_gpus() and importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed: pip install 'modelsvc[tensorrt]'")
    cache = tmp_path / "trt-cache"
    config = accelerators(
        accelerator(
            "tensorrt",
            precision_mode="FP16",
            max_workspace_size_bytes="1073741824",
            trt_engine_cache_enable="1",
            trt_engine_cache_path=str(cache),
            trt_builder_optimization_level="3",
        )
    )
    instance = _gpu_instance(tmp_path, config)
    assert instance.providers[0] == TRT, (
        f"ONNX Runtime did not load its TensorRT provider (providers {instance.providers}); "
        "is TensorRT's lib folder (tensorrt_libs) on LD_LIBRARY_PATH?"
    )
    applied = instance.provider_options()[TRT]
    assert applied["device_id"] == "0"
    assert applied["trt_fp16_enable"] == "1"
    assert applied["trt_max_workspace_size"] == "1073741824"
    assert applied["trt_engine_cache_enable"] == "1"
    assert applied["trt_engine_cache_path"] == str(cache)
    assert applied["trt_builder_optimization_level"] == "3"
    assert any(cache.iterdir()), "the TensorRT provider wrote no engine to trt_engine_cache_path"
