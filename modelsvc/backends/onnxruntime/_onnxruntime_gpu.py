"""ONNX Runtime on GPUs: Triton's ``optimization { execution_accelerators { gpu_execution_accelerator [...] } }``
and the CUDA ``parameters`` Triton still reads, checked and mapped onto the option names of ONNX Runtime's
TensorRT and CUDA execution providers.

``gpu_accelerators(config)`` is a pure function of the model config: it checks every key and value (for every
instance kind, so a config that a GPU machine would refuse is refused everywhere) and returns the providers'
option dicts; ``providers(accelerators, device_id)`` puts them in ONNX Runtime's order, TensorRT first. A bad
key or value is a ModelLoadError naming the model, the accelerator and the key.

The keys are those of Triton's ONNX Runtime backend; modelsvc takes no more (a config written here runs on
Triton), but it checks values that Triton passes through unchecked, accepts ONNX Runtime's names beside Triton's
numbers for the two CUDA enums, and writes flags as ``1``/``0``, which every ONNX Runtime version parses.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .._base import ModelConfig, ModelLoadError

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

#: an execution provider as ``onnxruntime.InferenceSession(providers=...)`` takes it
ProviderSpec = str | tuple[str, dict[str, str]]

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

_SIZE_MAX = 2**64 - 1


class _Bad(ValueError):
    """A value that does not parse; the message says what the key takes."""


Parse = Callable[[str], str]


def _flag(value: str) -> str:
    if value.lower() in TRUE:
        return "1"
    if value.lower() in FALSE:
        return "0"
    raise _Bad("must be true or false (1 or 0)")


def _integer(low: int, high: int | None = None) -> Parse:
    expected = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"

    def parse(value: str) -> str:
        try:
            number = int(value)
        except ValueError:
            raise _Bad(f"must be {expected}") from None
        if number < low or (high is not None and number > high):
            raise _Bad(f"must be {expected}")
        return str(number)

    return parse


def _bytes(value: str) -> str:
    try:
        number = int(value)
    except ValueError:
        raise _Bad("must be a number of bytes (an integer such as 1073741824)") from None
    if not 0 <= number <= _SIZE_MAX:
        raise _Bad("must be a number of bytes from 0 to 2^64-1")
    return str(number)


def _text(value: str) -> str:
    if not value:
        raise _Bad("must not be empty")
    return value


def _enum(names: tuple[str, ...]) -> Parse:
    """ONNX Runtime's name, or its number as Triton's deprecated ``parameters`` take it (0, 1, ...)."""

    def parse(value: str) -> str:
        for number, name in enumerate(names):
            if value in (name, str(number)):
                return name
        choices = ", ".join(f"{n} ({name})" for n, name in enumerate(names))
        raise _Bad(f"must be one of {choices}")

    return parse


def _tactics(value: str) -> str:
    items = [item.strip() for item in value.split(",")]
    if not all(len(item) > 1 and item[0] in "+-" for item in items):
        raise _Bad("must list tactic sources each with + or -, such as '-CUDNN,+CUBLAS'")
    return ",".join(items)


def parse_shapes(value: str) -> list[tuple[str, tuple[int, ...]]]:
    """``name:AxB,name2:CxD`` (ONNX Runtime's and trtexec's form) as (name, dims) pairs; a name given
    twice opens another optimization profile."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for item in value.split(","):
        name, sep, dims = item.strip().rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 0:
            raise _Bad(f"must be shapes such as 'input_ids:1x128,attention_mask:1x128'; '{item.strip()}' is not")
        out.append((name, shape))
    return out


def _shapes(value: str) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in parse_shapes(value))


#: Triton's key -> (the TensorRT provider's option, how its value is checked); precision_mode apart
_TRT_KEYS: dict[str, tuple[str, Parse]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", _bytes),
    "trt_max_partition_iterations": ("trt_max_partition_iterations", _integer(1)),
    "trt_min_subgraph_size": ("trt_min_subgraph_size", _integer(1)),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", _text),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", _flag),
    "trt_dla_enable": ("trt_dla_enable", _flag),
    "trt_dla_core": ("trt_dla_core", _integer(0)),
    "trt_engine_cache_enable": ("trt_engine_cache_enable", _flag),
    "trt_engine_cache_path": ("trt_engine_cache_path", _text),
    "trt_engine_cache_prefix": ("trt_engine_cache_prefix", _text),
    "trt_dump_subgraphs": ("trt_dump_subgraphs", _flag),
    "trt_force_sequential_engine_build": ("trt_force_sequential_engine_build", _flag),
    "trt_context_memory_sharing_enable": ("trt_context_memory_sharing_enable", _flag),
    "trt_layer_norm_fp32_fallback": ("trt_layer_norm_fp32_fallback", _flag),
    "trt_timing_cache_enable": ("trt_timing_cache_enable", _flag),
    "trt_timing_cache_path": ("trt_timing_cache_path", _text),
    "trt_force_timing_cache": ("trt_force_timing_cache", _flag),
    "trt_detailed_build_log": ("trt_detailed_build_log", _flag),
    "trt_build_heuristics_enable": ("trt_build_heuristics_enable", _flag),
    "trt_sparsity_enable": ("trt_sparsity_enable", _flag),
    "trt_builder_optimization_level": ("trt_builder_optimization_level", _integer(0, 5)),
    "trt_auxiliary_streams": ("trt_auxiliary_streams", _integer(-1)),
    "trt_tactic_sources": ("trt_tactic_sources", _tactics),
    "trt_extra_plugin_lib_paths": ("trt_extra_plugin_lib_paths", _text),
    "trt_profile_min_shapes": ("trt_profile_min_shapes", _shapes),
    "trt_profile_max_shapes": ("trt_profile_max_shapes", _shapes),
    "trt_profile_opt_shapes": ("trt_profile_opt_shapes", _shapes),
    "trt_cuda_graph_enable": ("trt_cuda_graph_enable", _flag),
    "trt_dump_ep_context_model": ("trt_dump_ep_context_model", _flag),
    "trt_ep_context_file_path": ("trt_ep_context_file_path", _text),
    "trt_ep_context_embed_mode": ("trt_ep_context_embed_mode", _integer(0, 1)),
}
_PRECISION = {"FP32": None, "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
TRT_KEYS = ("precision_mode", *_TRT_KEYS)

_CUDA_KEYS: dict[str, Parse] = {
    "gpu_mem_limit": _bytes,
    "arena_extend_strategy": _enum(("kNextPowerOfTwo", "kSameAsRequested")),
    "cudnn_conv_algo_search": _enum(("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
    "do_copy_in_default_stream": _flag,
    "cudnn_conv_use_max_workspace": _flag,
    "cudnn_conv1d_pad_to_nc1d": _flag,
    "enable_cuda_graph": _flag,
    "enable_skip_layer_norm_strict_mode": _flag,
    "prefer_nhwc": _flag,
    "use_ep_level_unified_stream": _flag,
    "use_tf32": _flag,
    "tunable_op_enable": _flag,
    "tunable_op_tuning_enable": _flag,
    "tunable_op_max_tuning_duration_ms": _integer(0),
    "sdpa_kernel": _integer(0),
    "fuse_conv_bias": _flag,
}
CUDA_KEYS = tuple(_CUDA_KEYS)
#: model ``parameters`` that Triton passes to the CUDA provider (deprecated there, still read)
CUDA_MODEL_PARAMETERS = (
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
)

_DEVICE = "the GPU is the instance's, from instance_group { kind: KIND_GPU gpus: [...] }"
_POINTER = "it takes a pointer, which a model config cannot hold"
_TRT_HINTS = {
    "device_id": _DEVICE,
    "trt_fp16_enable": "use precision_mode FP16",
    "trt_bf16_enable": "use precision_mode BF16",
    "trt_int8_enable": "use precision_mode INT8",
    "trt_max_workspace_size": "use max_workspace_size_bytes",
    "trt_int8_calibration_table_name": "use int8_calibration_table_name",
    "trt_int8_use_native_calibration_table": "use int8_use_native_calibration_table",
    "minimum_segment_size": "TensorFlow-TensorRT's name; use trt_min_subgraph_size",
    "max_partition_iterations": "use trt_max_partition_iterations",
    "max_cached_engines": "TensorFlow-TensorRT's; ONNX Runtime caches engines with trt_engine_cache_enable",
}
_CUDA_HINTS = {
    "device_id": _DEVICE,
    "cuda_mem_limit": "use gpu_mem_limit",
    "has_user_compute_stream": _POINTER,
    "user_compute_stream": _POINTER,
    "gpu_external_alloc": _POINTER,
    "gpu_external_free": _POINTER,
    "gpu_external_empty_cache": _POINTER,
}


@dataclass(frozen=True)
class GpuAccelerators:
    """The checked options of a model's GPU instances: ``tensorrt`` is None unless the config asks for the
    TensorRT accelerator; ``cuda`` holds only what the config sets (ONNX Runtime's defaults otherwise)."""

    tensorrt: dict[str, str] | None = None
    cuda: dict[str, str] = field(default_factory=dict)


def _unknown(where: str, key: str, keys: tuple[str, ...], hints: Mapping[str, str]) -> ModelLoadError:
    if key in hints:
        advice = hints[key]
    else:
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.7)
        advice = f"did you mean '{close[0]}'?" if close else f"its keys: {', '.join(keys)}"
    return ModelLoadError(f"{where}: unknown parameter '{key}' ({advice})")


def _tensorrt(model: str, parameters: Mapping[str, str]) -> dict[str, str]:
    where = f"model '{model}', gpu_execution_accelerator 'tensorrt'"
    options: dict[str, str] = {}
    for key, raw in sorted(parameters.items()):
        value = raw.strip()
        if key == "precision_mode":
            if value not in _PRECISION:  # exactly Triton's spelling, so the config runs on Triton too
                raise ModelLoadError(
                    f"{where}: parameter 'precision_mode': unsupported precision_mode '{value}' "
                    "(FP32, FP16, BF16 or INT8, in capitals)"
                )
            flag = _PRECISION[value]
            if flag is not None:
                options[flag] = "1"
            continue
        if key not in _TRT_KEYS:
            raise _unknown(where, key, TRT_KEYS, _TRT_HINTS)
        option, parse = _TRT_KEYS[key]
        try:
            options[option] = parse(value)
        except _Bad as exc:
            raise ModelLoadError(f"{where}: parameter '{key}' {exc}, got '{value}'") from None
    _check_profiles(where, options)
    return options


def _check_profiles(where: str, options: Mapping[str, str]) -> None:
    """ONNX Runtime needs min, opt and max together, naming the same inputs, with min <= opt <= max."""
    kinds = ("min", "opt", "max")
    given = {kind: options.get(f"trt_profile_{kind}_shapes") for kind in kinds}
    if not any(given.values()):
        return
    missing = [f"trt_profile_{kind}_shapes" for kind, value in given.items() if value is None]
    if missing:
        raise ModelLoadError(
            f"{where}: trt_profile_min_shapes, trt_profile_opt_shapes and trt_profile_max_shapes go together; "
            f"{' and '.join(missing)} missing"
        )
    by_name: dict[str, dict[str, list[tuple[int, ...]]]] = {kind: {} for kind in kinds}
    for kind, value in given.items():
        for name, dims in parse_shapes(value or ""):
            by_name[kind].setdefault(name, []).append(dims)
    counts = {kind: sorted((name, len(dims)) for name, dims in by_name[kind].items()) for kind in kinds}
    if not counts["min"] == counts["opt"] == counts["max"]:
        raise ModelLoadError(
            f"{where}: trt_profile_min_shapes, trt_profile_opt_shapes and trt_profile_max_shapes must name the "
            "same inputs as often (once per profile), got "
            + "; ".join(f"{kind} {', '.join(f'{n} x{c}' for n, c in counts[kind])}" for kind in kinds)
        )
    for name, lows in by_name["min"].items():
        triples = zip(lows, by_name["opt"][name], by_name["max"][name], strict=True)
        for low, opt, high in triples:
            _check_range(where, name, low, opt, high)


def _check_range(where: str, name: str, low: tuple[int, ...], opt: tuple[int, ...], high: tuple[int, ...]) -> None:
    shown = f"min {'x'.join(map(str, low))}, opt {'x'.join(map(str, opt))}, max {'x'.join(map(str, high))}"
    if not len(low) == len(opt) == len(high):
        raise ModelLoadError(f"{where}: the profile shapes of input '{name}' differ in rank: {shown}")
    if any(not a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
        raise ModelLoadError(
            f"{where}: the profile shapes of input '{name}' need min <= opt <= max in every dimension, got {shown}"
        )


def _cuda_option(where: str, key: str, raw: str) -> str:
    value = raw.strip()
    if key not in _CUDA_KEYS:
        raise _unknown(where, key, CUDA_KEYS, _CUDA_HINTS)
    try:
        return _CUDA_KEYS[key](value)
    except _Bad as exc:
        raise ModelLoadError(f"{where}: parameter '{key}' {exc}, got '{value}'") from None


def gpu_accelerators(config: ModelConfig) -> GpuAccelerators:
    """Check and map the config's GPU accelerators and its CUDA ``parameters``; ModelLoadError on a bad one."""
    model = config.name
    tensorrt: dict[str, str] | None = None
    cuda: dict[str, str] = {}
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        name = accelerator.name
        if name == "tensorrt":
            if tensorrt is not None:
                raise ModelLoadError(f"model '{model}': gpu_execution_accelerator 'tensorrt' is listed twice")
            tensorrt = _tensorrt(model, accelerator.parameters)
        elif name == "cuda":
            where = f"model '{model}', gpu_execution_accelerator 'cuda'"
            for key, raw in sorted(accelerator.parameters.items()):
                value = _cuda_option(where, key, raw)
                if cuda.get(key, value) != value:
                    raise ModelLoadError(f"{where}: parameter '{key}' is given twice, as '{cuda[key]}' and '{value}'")
                cuda[key] = value
        else:
            raise ModelLoadError(
                f"model '{model}': unknown gpu_execution_accelerator '{name}' "
                "(the ONNX Runtime backend has 'tensorrt' and 'cuda')"
            )
    for key in CUDA_MODEL_PARAMETERS:
        if key not in config.parameters:
            continue
        where = f"model '{model}', parameters (read for the CUDA execution provider)"
        value = _cuda_option(where, key, config.parameters[key].string_value)
        if cuda.get(key, value) != value:
            raise ModelLoadError(
                f"model '{model}': parameter '{key}' is '{value}' in parameters but '{cuda[key]}' in "
                "gpu_execution_accelerator 'cuda'; set it in one place"
            )
        cuda[key] = value
    return GpuAccelerators(tensorrt, cuda)


def providers(accelerators: GpuAccelerators, device_id: int) -> list[ProviderSpec]:
    """The providers of an instance on GPU ``device_id``, best first: TensorRT when asked for, CUDA, CPU."""
    device = {"device_id": str(device_id)}
    out: list[ProviderSpec] = []
    if accelerators.tensorrt is not None:
        out.append((TRT, {**accelerators.tensorrt, **device}))
    out.append((CUDA, {**accelerators.cuda, **device}))
    out.append(CPU)
    return out
