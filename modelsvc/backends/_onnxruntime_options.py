"""ONNX Runtime options from a model config: session and run options from ``parameters`` and
``optimization``, and the execution providers (TensorRT, CUDA, CPU) of an instance. The parameters are
documented in ``_onnxruntime``'s docstring; a bad value is a ModelLoadError naming the key."""

from __future__ import annotations

import onnxruntime as ort

from ._base import ModelConfig, ModelLoadError

_CUDA = "CUDAExecutionProvider"
_TRT = "TensorrtExecutionProvider"
_CPU = "CPUExecutionProvider"

_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# TensorRT accelerator parameters that pass through under their own name (see the backend's README)
_TRT_PASSTHROUGH = {
    "trt_max_partition_iterations",
    "trt_min_subgraph_size",
    "trt_dla_enable",
    "trt_dla_core",
    "trt_engine_cache_enable",
    "trt_engine_cache_path",
    "trt_engine_cache_prefix",
    "trt_dump_subgraphs",
    "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable",
    "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable",
    "trt_timing_cache_path",
    "trt_force_timing_cache",
    "trt_detailed_build_log",
    "trt_build_heuristics_enable",
    "trt_sparsity_enable",
    "trt_builder_optimization_level",
    "trt_auxiliary_streams",
    "trt_tactic_sources",
    "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes",
    "trt_profile_max_shapes",
    "trt_profile_opt_shapes",
    "trt_cuda_graph_enable",
}
_TRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_PRECISION = {
    "FP32": None,
    "FP16": "trt_fp16_enable",
    "BF16": "trt_bf16_enable",
    "INT8": "trt_int8_enable",
}

ProviderSpec = str | tuple[str, dict[str, str]]


def _param(config: ModelConfig, key: str) -> str | None:
    if key in config.parameters:
        return str(config.parameters[key].string_value).strip()
    return None


def _bool_param(config: ModelConfig, key: str, default: bool) -> bool:
    value = _param(config, key)
    if value is None or value == "":
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ModelLoadError(f"parameter '{key}' must be true/false or 1/0, got '{value}'")


def _int_param(config: ModelConfig, key: str, default: int) -> int:
    value = _param(config, key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ModelLoadError(f"parameter '{key}' must be an integer, got '{value}'") from None


def _session_options(config: ModelConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
    options.graph_optimization_level = _GRAPH_LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    mode = _int_param(config, "execution_mode", 0)
    if mode not in (0, 1):
        raise ModelLoadError(f"parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got {mode}")
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    intra = _int_param(config, "intra_op_thread_count", 0)
    if intra > 0:
        options.intra_op_num_threads = intra
    inter = _int_param(config, "inter_op_thread_count", 0)
    if inter > 0:
        options.inter_op_num_threads = inter
    if _param(config, "enable_mem_arena") is not None:
        options.enable_cpu_mem_arena = _bool_param(config, "enable_mem_arena", True)
    if _param(config, "enable_mem_pattern") is not None:
        options.enable_mem_pattern = _bool_param(config, "enable_mem_pattern", True)
    initializers = _param(config, "session.use_device_allocator_for_initializers")
    if initializers is not None:
        options.add_session_config_entry("session.use_device_allocator_for_initializers", initializers)
    spinning = "1" if _bool_param(config, "allow_spinning", False) else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    return options


def _run_options(config: ModelConfig) -> ort.RunOptions | None:
    shrinkage = _param(config, "memory.enable_memory_arena_shrinkage")
    if shrinkage is None:
        return None
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
    return options


def _trt_options(parameters: dict[str, str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value not in _TRT_PRECISION:
                raise ModelLoadError(f"unsupported TensorRT precision_mode '{value}' (FP32, FP16, BF16 or INT8)")
            flag = _TRT_PRECISION[value]
            if flag is not None:
                options[flag] = "1"
        elif key in _TRT_RENAMED:
            options[_TRT_RENAMED[key]] = value
        elif key in _TRT_PASSTHROUGH:
            options[key] = value
        else:
            raise ModelLoadError(f"unknown parameter '{key}' for the TensorRT execution accelerator")
    return options


def _gpu_providers(config: ModelConfig, device_id: int) -> tuple[list[ProviderSpec], bool]:
    """Providers for a GPU instance, best first; and whether TensorRT was asked for."""
    cuda: dict[str, str] = {}
    trt: dict[str, str] | None = None
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        params = dict(accelerator.parameters)
        if accelerator.name == "tensorrt":
            trt = _trt_options(params)
        elif accelerator.name == "cuda":
            cuda.update(params)
        else:
            raise ModelLoadError(f"unknown gpu_execution_accelerator '{accelerator.name}' (supported: tensorrt, cuda)")
    providers: list[ProviderSpec] = []
    if trt is not None:
        providers.append((_TRT, {**trt, "device_id": str(device_id)}))
    providers.append((_CUDA, {**cuda, "device_id": str(device_id)}))
    providers.append(_CPU)
    return providers, trt is not None


def _check_cpu_accelerators(config: ModelConfig) -> None:
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name == "openvino":
            raise ModelLoadError(
                "cpu_execution_accelerator 'openvino' is not supported by modelsvc's ONNX Runtime backend; "
                "remove it to run on ONNX Runtime's CPU provider"
            )
        raise ModelLoadError(f"unknown cpu_execution_accelerator '{accelerator.name}'")


def _available(providers: list[ProviderSpec]) -> list[ProviderSpec]:
    # ORT warns (a Python warning) about providers its build lacks; leave those out ourselves.
    available = set(ort.get_available_providers())
    return [p for p in providers if (p if isinstance(p, str) else p[0]) in available]
