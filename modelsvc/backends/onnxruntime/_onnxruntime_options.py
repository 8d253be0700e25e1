"""ONNX Runtime options from a model config: session and run options from ``parameters`` and
``optimization``, and the execution providers (TensorRT, CUDA, CPU) of an instance, whose GPU options
``_onnxruntime_gpu`` checks and maps. The parameters are documented in ``_onnxruntime``'s docstring; a bad
value is a ModelLoadError naming the key."""

from __future__ import annotations

import logging
import threading

import onnxruntime as ort

from .._base import ModelConfig, ModelLoadError
from ._onnxruntime_gpu import FALSE, TRUE, ProviderSpec, gpu_accelerators
from ._onnxruntime_gpu import providers as gpu_providers

logger = logging.getLogger("modelsvc.backends.onnxruntime")

_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def _param(config: ModelConfig, key: str) -> str | None:
    if key in config.parameters:
        return str(config.parameters[key].string_value).strip()
    return None


def _bool_param(config: ModelConfig, key: str, default: bool) -> bool:
    value = _param(config, key)
    if value is None or value == "":
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
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


def _gpu_providers(config: ModelConfig, device_id: int) -> tuple[list[ProviderSpec], bool]:
    """Providers for a GPU instance, best first; and whether TensorRT was asked for (see ``_onnxruntime_gpu``)."""
    accelerators = gpu_accelerators(config)
    return gpu_providers(accelerators, device_id), accelerators.tensorrt is not None


def _check_cpu_accelerators(config: ModelConfig) -> bool:
    """Whether the config names the ``openvino`` CPU execution accelerator (its CPU instances then run the ONNX
    file on OpenVINO, ``_openvino.onnx_instances``); any other name is a ModelLoadError."""
    openvino = False
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino":
            raise ModelLoadError(
                f"model '{config.name}': unknown cpu_execution_accelerator '{accelerator.name}' (supported: openvino)"
            )
        openvino = True
    return openvino


def _available(providers: list[ProviderSpec]) -> list[ProviderSpec]:
    # ORT warns (a Python warning) about providers its build lacks; leave those out ourselves.
    available = set(ort.get_available_providers())
    return [p for p in providers if (p if isinstance(p, str) else p[0]) in available]


_preload_lock = threading.Lock()
_preloaded = False


def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries that ONNX Runtime's CUDA provider needs, once per process, before the
    first session that asks for it: in an environment made with pip alone they exist only as nvidia-* wheels, where
    the provider does not look, and ONNX Runtime then runs on the CPU without a word. ``onnxruntime.preload_dlls``
    (ORT 1.21+) finds them (torch's, the nvidia-* wheels', the system's); an older ORT has none (nothing done)."""
    global _preloaded
    with _preload_lock:
        if _preloaded:
            return
        _preloaded = True
        preload = getattr(ort, "preload_dlls", None)
        if preload is None:
            return
        try:
            preload()
        except Exception as exc:  # a library that does not load: the session says which provider it got
            logger.warning("onnxruntime.preload_dlls() failed (%s); the CUDA provider may not load", exc)
