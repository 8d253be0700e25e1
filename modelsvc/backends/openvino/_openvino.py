"""The OpenVINO backend: Triton's ``openvino`` backend (``backend: "openvino"`` or ``platform: "openvino"``).

Model files: an IR, ``model.xml`` with ``model.bin`` beside it (the default), or through
``default_model_filename`` any file OpenVINO reads, ``model.onnx`` among them. The same code runs the ONNX models
of the ``onnxruntime`` backend whose config asks for ``optimization { execution_accelerators {
cpu_execution_accelerator [ { name: "openvino" } ] } }`` (:func:`onnx_instances`).

``parameters`` (string values, case-insensitive; anything else is a ModelLoadError naming the model and key):

``PERFORMANCE_HINT``  ``LATENCY``, ``THROUGHPUT`` or ``CUMULATIVE_THROUGHPUT`` (OpenVINO's own default: LATENCY).
``NUM_STREAMS``  ``AUTO``, ``NUMA`` or a number: OpenVINO's executor streams (batches that run at once).
``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS``  thread counts (0: OpenVINO chooses).
``HINT_BF16``  ``YES``: bf16 inference precision (Triton's key; same as ``INFERENCE_PRECISION_HINT`` bf16).
``INFERENCE_PRECISION_HINT`` (modelsvc, OpenVINO's property)  ``f32``, ``bf16`` or ``f16``. A CPU without native
    bf16 / f16 (AVX-512 BF16, AMX) runs f32 whatever is asked. Every load logs one line with what the compiled
    model really runs, read back from it: INFO, or WARNING when that is not the precision asked for.
``CPU_EXTENSION_PATH``  a shared library of custom operations, added to the OpenVINO core.
``TARGET_DEVICE``  the OpenVINO device (default ``CPU``; ``GPU``, ``AUTO``, ... where OpenVINO sees one).
``SKIP_OV_DYNAMIC_BATCHSIZE``  ``YES``: the batch dimension is fixed at ``max_batch_size`` instead of made
    dynamic; a shorter batch is then a 400, unless ``ENABLE_BATCH_PADDING`` is ``YES``, which pads it with zeros
    (and drops the padding from the outputs).
``RESHAPE_IO_LAYERS``  ``YES``: the inputs get the config's dims (-1 a dynamic dimension). Without it the model's
    own shapes are checked against the config, except that a -1 in the config where the model has a fixed
    dimension makes that dimension dynamic (a static IR served with any sequence length).

With ``max_batch_size`` > 0 the first dimension of every input is the batch: made dynamic (any batch up to
``max_batch_size`` runs) unless ``SKIP_OV_DYNAMIC_BATCHSIZE``. The config is completed from the model as Triton
does (names, datatypes, dims; max_batch_size 4 and dynamic_batching for a model that batches, when inputs or
outputs are left out) and checked against it: a tensor name the model lacks, another datatype or rank is a
ConfigMismatchError naming the model and the tensor. Datatypes: BOOL, UINT8..64, INT8..64, FP16, BF16, FP32,
FP64; the CPU plugin computes INT64 / UINT64 in signed 32 bits (an input value beyond is a 400 naming the tensor,
not a wrong answer) and FP64 in FP32. OpenVINO 2026.4 has string tensors, but its CPU plugin crashed (segfault)
within a few requests on a string identity model, so BYTES models are refused at load.

Instances, and why. Each ``instance_group`` entry compiles the model once (one CompiledModel, CPU only: a
KIND_GPU group is refused, NVIDIA GPUs are not OpenVINO devices) and makes ``max(count,
OPTIMAL_NUMBER_OF_INFER_REQUESTS)`` InferRequests on it, each a ModelInstance with its own worker thread (the
scheduler runs one batch per instance at a time). OpenVINO releases the GIL in ``infer``, so batches on
different requests run at once on the compiled model's streams: NUM_STREAMS (or PERFORMANCE_HINT THROUGHPUT)
sets how many overlap. ``max`` rather than ``count x`` requests keeps Triton's advice (``count: 12`` with
``NUM_STREAMS 12``: 12 requests on one compiled model) while a THROUGHPUT hint alone still gets its requests.
Beyond Triton: a group with ``count`` > 1 and neither NUM_STREAMS nor PERFORMANCE_HINT gets NUM_STREAMS =
``count`` (OpenVINO caps it at the cores); with OpenVINO's default (LATENCY, one stream) its instances would
only take turns (measured: 2 instances on one stream ran 16 batches of 1 x 128 no faster than 1 did,
NUM_STREAMS 2 ran them 1.3-1.5x faster).
Measured in process on this 2-core AVX2 machine with MiniLM (the doc_classifier's ONNX file on OpenVINO, f32),
while other jobs kept the load average at 6-8, so wall times are best of 5 interleaved runs and CPU time per
batch is the steadier figure (``python -m loadtests.bench_openvino_streams [--batch 1 --batches 16]``):

    ==========================  ======================  ======================  ========================
    16 batches of 1 x 128       ORT f32, 1 session      OV, 1 stream (default)  OV, NUM_STREAMS 2 (2 req.)
    wall (best of 5)            1.62 s                  2.61 s                  1.89 s
    CPU per batch (median)      59 ms                   81 ms                   59 ms
    8 batches of 4 x 128
    wall (best of 5)            5.05 s                  6.14 s                  4.54 s
    CPU per batch (median)      252 ms                  264 ms                  242 ms
    ==========================  ======================  ======================  ========================

Two overlapping batches, one thread each, use the cores better than one batch on two threads (OpenVINO's
default LATENCY hint), most for small batches; that is what NUM_STREAMS 2 or PERFORMANCE_HINT THROUGHPUT buys.
The default stays OpenVINO's (LATENCY, one request per instance), as in Triton.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import openvino as ov
from tritonclient.grpc import model_config_pb2

from .._base import ConfigMismatchError, ModelConfig, ModelInstance, ModelLoadError
from .._devices import Placement, placements
from ._openvino_instance import OpenVINOInstance
from ._openvino_model import complete_config, read_model
from ._openvino_options import OpenVINOOptions, onnx_accelerator_options, parse_options
from ._openvino_shapes import reshape_verdicts

logger = logging.getLogger("modelsvc.backends.openvino")

#: Triton's ``--backend-config=openvino,default-max-batch-size`` default
DEFAULT_MAX_BATCH_SIZE = 4

_KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU
_KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU

_core: ov.Core | None = None
_core_lock = threading.Lock()


def core() -> ov.Core:
    """The process's OpenVINO core (one: it caches plugins and compiled kernels)."""
    global _core
    with _core_lock:
        if _core is None:
            _core = ov.Core()
        return _core


def _cpu_places(config: ModelConfig) -> list[Placement]:
    """The instances the config asks for, all on the CPU. The repository makes this backend's default and KIND_AUTO
    groups KIND_CPU (Triton's openvino backend prefers the CPU); an explicit KIND_GPU group is a ModelLoadError."""
    for group in config.instance_group:
        if group.kind == _KIND_GPU:
            raise ModelLoadError(
                f"instance group '{group.name or config.name}' of model '{config.name}' is KIND_GPU, but the "
                "openvino backend runs on OpenVINO devices (parameter TARGET_DEVICE), not CUDA GPUs: use KIND_CPU"
            )
    cpu_only = model_config_pb2.ModelConfig()
    cpu_only.CopyFrom(config)
    for group in cpu_only.instance_group:
        group.kind = _KIND_CPU
    try:
        return placements(cpu_only, "openvino")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None


def _check_device(config: ModelConfig, options: OpenVINOOptions) -> None:
    device = options.device
    available = list(core().available_devices)
    base = device.split(":", 1)[0].split(".", 1)[0]
    if device in available or base in ("AUTO", "HETERO", "MULTI", "BATCH") or base in available:
        return
    raise ModelLoadError(
        f"model '{config.name}': parameter 'TARGET_DEVICE' is '{device}', which OpenVINO does not see here "
        f"(available: {', '.join(available) or 'none'})"
    )


def _compile(
    config: ModelConfig, model: ov.Model, options: OpenVINOOptions, group: str, count: int
) -> ov.CompiledModel:
    properties = dict(options.properties)
    if count > 1 and "NUM_STREAMS" not in properties and "PERFORMANCE_HINT" not in properties:
        properties["NUM_STREAMS"] = str(count)  # else the group's instances would wait on OpenVINO's one stream
    try:
        compiled = core().compile_model(model, options.device, properties)
    except Exception as exc:
        raise ModelLoadError(
            f"instance group '{group}' of model '{config.name}': OpenVINO cannot compile it for "
            f"{options.device} with {properties or 'default properties'}: {exc}"
        ) from exc
    _log_compiled(config, compiled, options, group)
    return compiled


def _property(compiled: ov.CompiledModel, name: str) -> str:
    try:
        value = compiled.get_property(name)
    except Exception:
        return "?"
    if isinstance(value, ov.Type):
        return str(value.get_type_name())
    text = str(value)
    return text.split(".", 1)[1] if text.startswith("PerformanceMode.") else text


def _log_compiled(config: ModelConfig, compiled: ov.CompiledModel, options: OpenVINOOptions, group: str) -> None:
    precision = _property(compiled, "INFERENCE_PRECISION_HINT")
    details = (
        f"PERFORMANCE_HINT {_property(compiled, 'PERFORMANCE_HINT')}, "
        f"NUM_STREAMS {_property(compiled, 'NUM_STREAMS')}, "
        f"INFERENCE_NUM_THREADS {_property(compiled, 'INFERENCE_NUM_THREADS')}, "
        f"OPTIMAL_NUMBER_OF_INFER_REQUESTS {_property(compiled, 'OPTIMAL_NUMBER_OF_INFER_REQUESTS')}, "
        f"INFERENCE_PRECISION_HINT {precision}"
    )
    asked = options.precision
    if asked is not None and asked != precision:
        logger.warning(
            "model '%s' (%s): INFERENCE_PRECISION_HINT %s was asked, but OpenVINO compiled it to run %s on this "
            "%s (no native %s support); %s",
            config.name,
            group,
            asked,
            precision,
            options.device,
            asked,
            details,
        )
    else:
        logger.info("model '%s' (%s): OpenVINO %s, %s", config.name, group, options.device, details)


def _requests(compiled: ov.CompiledModel, count: int) -> int:
    try:
        optimal = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    except Exception:
        optimal = 1
    return max(count, optimal, 1)


def build_instances(
    config: ModelConfig, artifact: Path, options: OpenVINOOptions, where: Sequence[Placement]
) -> list[ModelInstance]:
    """Read ``artifact``, reshape it as the config asks, check the config against it (on a copy: the served config
    is left alone), and for each instance group of ``where`` compile it once and make its InferRequests."""
    if options.extension:
        try:
            core().add_extension(options.extension)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{config.name}': parameter 'CPU_EXTENSION_PATH': OpenVINO cannot load "
                f"'{options.extension}': {exc}"
            ) from exc
    _check_device(config, options)
    model = read_model(core(), artifact, config)
    checked = model_config_pb2.ModelConfig()
    checked.CopyFrom(config)
    complete_config(checked, model, options, DEFAULT_MAX_BATCH_SIZE)
    listed = {entry.name for entry in config.input}
    for port in model.inputs:  # complete_config adds it to the copy; the served config would never feed it
        if not listed & set(port.get_names()):
            raise ConfigMismatchError(
                f"model '{config.name}' has input '{port.get_any_name()}', which the configuration does not list: "
                "OpenVINO needs every input fed (list it, or let the configuration be auto-completed)",
                field="input",
            )
    fixed = int(config.max_batch_size) if options.skip_dynamic_batch and config.max_batch_size > 0 else None
    groups: dict[str, int] = {}
    for place in where:
        groups[place.group] = groups.get(place.group, 0) + 1
    # what the model's shape inference says of inputs that failed an inference (the model read again on need)
    verdicts = reshape_verdicts(lambda: read_model(core(), artifact, config))
    instances: list[ModelInstance] = []
    try:
        for group, count in groups.items():
            compiled = _compile(config, model, options, group, count)
            total = _requests(compiled, count)
            for number in range(total):
                name = group if total == 1 else f"{group}_{number}"
                request = compiled.create_infer_request()
                instances.append(
                    OpenVINOInstance(
                        name, config.name, options.device, request, compiled, fixed, options.batch_padding, verdicts
                    )
                )
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    return instances


def onnx_instances(config: ModelConfig, artifact: Path, where: Sequence[Placement]) -> list[ModelInstance]:
    """The CPU instances of an ``onnxruntime`` model whose config names the ``openvino`` CPU execution
    accelerator: its ONNX file runs on OpenVINO (see the README's ONNX Runtime section for why not ORT's
    OpenVINO provider)."""
    return build_instances(config, artifact, onnx_accelerator_options(config), where)


class OpenVINOBackend:
    """Loads IR (or ONNX) models into OpenVINO compiled models, their InferRequests the instances."""

    name = "openvino"

    def __init__(self, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        self.default_max_batch_size = default_max_batch_size

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Complete ``config`` from the model and check it (``_openvino_model.complete_config``)."""
        options = parse_options(config)
        model = read_model(core(), artifact, config)
        complete_config(config, model, options, self.default_max_batch_size)

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """Per instance group one compiled model, and its InferRequests as instances."""
        options = parse_options(config)
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' for model '{config.name}' version {version}")
        return build_instances(config, artifact, options, _cpu_places(config))
