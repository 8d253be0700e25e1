"""The ``parameters`` of an ``openvino`` model, read and checked: Triton's keys (see ``_openvino``'s docstring),
plus ``INFERENCE_PRECISION_HINT`` (modelsvc, OpenVINO's own property name). Values are case-insensitive, as in
Triton's backend; a key that no layer of modelsvc reads, or a bad value, is a ModelLoadError naming the model
and the key. Imports nothing of OpenVINO: the properties are OpenVINO's string names and values."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._base import ModelConfig, ModelLoadError

#: OpenVINO element type name -> model config DataType name. OpenVINO 2026.4 has string tensors, but its CPU
#: plugin corrupts memory when one runs through a model (a segfault within a few requests in our checks), so
#: TYPE_STRING models are refused at load (see ``check_datatype``).
OV_TO_CONFIG: dict[str, str] = {
    "boolean": "TYPE_BOOL",
    "u8": "TYPE_UINT8",
    "u16": "TYPE_UINT16",
    "u32": "TYPE_UINT32",
    "u64": "TYPE_UINT64",
    "i8": "TYPE_INT8",
    "i16": "TYPE_INT16",
    "i32": "TYPE_INT32",
    "i64": "TYPE_INT64",
    "f16": "TYPE_FP16",
    "bf16": "TYPE_BF16",
    "f32": "TYPE_FP32",
    "f64": "TYPE_FP64",
    "string": "TYPE_STRING",
}

#: the keys Triton's openvino backend reads (and modelsvc with it)
TRITON_KEYS = (
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "COMPILATION_NUM_THREADS",
    "HINT_BF16",
    "CPU_EXTENSION_PATH",
    "SKIP_OV_DYNAMIC_BATCHSIZE",
    "ENABLE_BATCH_PADDING",
    "RESHAPE_IO_LAYERS",
    "TARGET_DEVICE",
)
#: modelsvc's own additions
MODELSVC_KEYS = ("INFERENCE_PRECISION_HINT",)
#: keys other layers read from the same ``parameters`` (the scheduler's padding-aware batching,
#: ``modelsvc.scheduler._padding.KEYS``); an openvino model may carry them
OTHER_KEYS = ("pad_inputs", "pad_outputs", "pad_buckets", "max_batch_tokens", "pad_call_cost_tokens")

_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT", "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}
_PRECISIONS = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}
_YES = ("yes", "true", "1", "on")
_NO = ("no", "false", "0", "off")


@dataclass
class OpenVINOOptions:
    """What the parameters ask for: OpenVINO compile properties and the backend's own switches."""

    #: OpenVINO property name -> value, passed to ``Core.compile_model``
    properties: dict[str, str] = field(default_factory=dict)
    #: the device OpenVINO compiles for (Triton's ``TARGET_DEVICE``, default ``CPU``)
    device: str = "CPU"
    #: a shared library of custom operations (``CPU_EXTENSION_PATH``)
    extension: str | None = None
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io_layers: bool = False

    @property
    def precision(self) -> str | None:
        """The inference precision asked for (``f32``, ``bf16``, ``f16``), None when left to OpenVINO."""
        return self.properties.get("INFERENCE_PRECISION_HINT")


def _bad(config: ModelConfig, key: str, value: str, expected: str) -> ModelLoadError:
    return ModelLoadError(f"model '{config.name}': parameter '{key}' must be {expected}, got '{value}'")


def _flag(config: ModelConfig, key: str, value: str) -> bool:
    if value.lower() in _YES:
        return True
    if value.lower() in _NO:
        return False
    raise _bad(config, key, value, "YES or NO")


def _count(config: ModelConfig, key: str, value: str) -> str:
    if not value.isdigit():
        raise _bad(config, key, value, "a non-negative integer")
    return str(int(value))


def parse_options(config: ModelConfig) -> OpenVINOOptions:
    """The options of an ``openvino`` model; ModelLoadError naming the model and the key for a bad one."""
    options = OpenVINOOptions()
    known = {*TRITON_KEYS, *MODELSVC_KEYS, *OTHER_KEYS}
    for key in sorted(config.parameters):
        if key not in known:
            raise ModelLoadError(
                f"model '{config.name}': unknown parameter '{key}' for the openvino backend "
                f"(it reads {', '.join(TRITON_KEYS + MODELSVC_KEYS)})"
            )
    values = {key: str(config.parameters[key].string_value).strip() for key in config.parameters}
    for key, value in values.items():
        if key in OTHER_KEYS or value == "":
            continue
        lower = value.lower()
        if key == "PERFORMANCE_HINT":
            if lower not in _HINTS:
                raise _bad(config, key, value, "LATENCY, THROUGHPUT or CUMULATIVE_THROUGHPUT")
            options.properties[key] = _HINTS[lower]
        elif key == "NUM_STREAMS":
            if lower in ("auto", "numa"):
                options.properties[key] = lower.upper()
            else:
                options.properties[key] = _count(config, key, value)
        elif key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
            options.properties[key] = _count(config, key, value)
        elif key == "HINT_BF16":
            if lower not in _YES:
                raise _bad(config, key, value, "YES")
            options.properties["INFERENCE_PRECISION_HINT"] = "bf16"
        elif key == "INFERENCE_PRECISION_HINT":
            if lower not in _PRECISIONS:
                raise _bad(config, key, value, "f32, bf16 or f16")
            options.properties[key] = _PRECISIONS[lower]
        elif key == "CPU_EXTENSION_PATH":
            options.extension = value
        elif key == "TARGET_DEVICE":
            options.device = value.upper()
        elif key == "SKIP_OV_DYNAMIC_BATCHSIZE":
            options.skip_dynamic_batch = _flag(config, key, value)
        elif key == "ENABLE_BATCH_PADDING":
            options.batch_padding = _flag(config, key, value)
        elif key == "RESHAPE_IO_LAYERS":
            options.reshape_io_layers = _flag(config, key, value)
    hint_bf16 = values.get("HINT_BF16", "")
    precision = values.get("INFERENCE_PRECISION_HINT", "")
    if hint_bf16 and precision and _PRECISIONS.get(precision.lower()) != "bf16":
        raise ModelLoadError(
            f"model '{config.name}': parameters 'HINT_BF16' and 'INFERENCE_PRECISION_HINT' ('{precision}') disagree"
        )
    return options


def onnx_accelerator_options(config: ModelConfig) -> OpenVINOOptions:
    """Options for an ONNX model that ``cpu_execution_accelerator { name: "openvino" }`` hands to OpenVINO:
    the accelerator takes no parameters (as in Triton's ORT backend; any is a ModelLoadError naming it), and of
    the ORT backend's ``parameters`` ``intra_op_thread_count`` becomes ``INFERENCE_NUM_THREADS``. The precision is
    f32, as ONNX Runtime's OpenVINO provider runs a CPU by default (its ``CPU_FP32``): OpenVINO left to itself runs
    bf16 on a CPU with native bf16 (AVX-512 BF16, AMX), and an accelerator must not change the model's answers."""
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        for key in accelerator.parameters:
            raise ModelLoadError(
                f"model '{config.name}': cpu_execution_accelerator 'openvino' takes no parameters, got '{key}'"
            )
    options = OpenVINOOptions()
    options.properties["INFERENCE_PRECISION_HINT"] = "f32"
    if "intra_op_thread_count" in config.parameters:
        value = str(config.parameters["intra_op_thread_count"].string_value).strip()
        if value.isdigit() and int(value) > 0:
            options.properties["INFERENCE_NUM_THREADS"] = str(int(value))
    return options
