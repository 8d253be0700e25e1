"""The ONNX Runtime backend: Triton's ``onnxruntime`` backend (platform ``onnxruntime_onnx``) in Python.

Model-config ``parameters`` read here (string values, as in Triton's ORT backend):

``intra_op_thread_count``, ``inter_op_thread_count``
    ORT thread pool sizes; 0 or absent lets ORT choose (one thread per core).
``execution_mode``
    ``0`` sequential (default), ``1`` parallel.
``enable_mem_arena``, ``enable_mem_pattern``
    ``1``/``true`` or ``0``/``false``: ORT's CPU memory arena and memory pattern.
``memory.enable_memory_arena_shrinkage``
    passed to every run as a run config entry.
``session.use_device_allocator_for_initializers``
    passed to the session as a config entry.
``allow_spinning`` (modelsvc)
    ``true`` lets ORT's pool threads spin while waiting for work (ORT's default). modelsvc turns
    spinning off unless asked: on a machine with few cores, spinning ORT threads starve the HTTP
    event loop that feeds them, for little gain in latency.
``allow_cpu_fallback`` (modelsvc)
    ``true`` accepts running a ``KIND_GPU`` instance on the CPU when ONNX Runtime cannot load its
    CUDA provider (a warning is logged). Without it such an instance fails to load: ORT's own
    fallback is silent, and a GPU model quietly running on CPU is worse than one that fails.

``cudnn_conv_algo_search``, ``gpu_mem_limit``, ``arena_extend_strategy``, ``do_copy_in_default_stream``
    options of the CUDA provider, as Triton still reads them from ``parameters`` (see ``_onnxruntime_gpu``).

``optimization { graph { level } }`` picks ORT's graph optimization level as Triton does: -1 basic,
1 extended, 2 none, anything else (the default 0) all. ``optimization { execution_accelerators {
gpu_execution_accelerator [{ name: "tensorrt" ... }] } }`` puts the TensorRT provider ahead of CUDA
(``precision_mode`` FP32/FP16/BF16/INT8, ``max_workspace_size_bytes`` and the ``trt_*`` keys);
``name: "cuda"`` sets options of the CUDA provider. ``_onnxruntime_gpu`` lists and checks every key, for
every instance kind: a model whose GPU accelerators are wrong fails to load on a CPU-only machine too.
``cpu_execution_accelerator [{ name: "openvino" }]`` (no parameters, as in Triton) runs the CPU instances' ONNX
file on OpenVINO (``_openvino.onnx_instances``; ``intra_op_thread_count`` becomes OpenVINO's thread count):
ORT's OpenVINO provider ships in a wheel that cannot sit beside onnxruntime-gpu.

The options read from the config live in ``_onnxruntime_options``; the instance that runs batches in
``_onnxruntime_instance``. This module completes and checks configs and creates the instances.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from modelsvc.protocol import ONNX_TO_CONFIG

from .._base import (
    ConfigMismatchError,
    ModelConfig,
    ModelInstance,
    ModelLoadError,
    complete_dims,
    data_type_name,
    data_type_value,
)
from .._devices import Placement, placements
from .._shapes import Verdicts
from ._onnxruntime_gpu import CPU as _CPU
from ._onnxruntime_gpu import CUDA as _CUDA
from ._onnxruntime_gpu import TRT as _TRT
from ._onnxruntime_gpu import GpuAccelerators, ProviderSpec, gpu_accelerators
from ._onnxruntime_gpu import providers as gpu_providers
from ._onnxruntime_instance import OnnxRuntimeInstance
from ._onnxruntime_options import (
    _available,
    _bool_param,
    _check_cpu_accelerators,
    _run_options,
    _session_options,
    preload_cuda_libraries,
)
from ._onnxruntime_shapes import onnx_verdicts

logger = logging.getLogger("modelsvc.backends.onnxruntime")

#: Triton's ``--backend-config=onnxruntime,default-max-batch-size`` default
DEFAULT_MAX_BATCH_SIZE = 4


# --- tensors ---------------------------------------------------------------------------------------


class _TensorInfo:
    __slots__ = ("data_type", "dims", "name")

    def __init__(self, node: Any) -> None:
        self.name: str = node.name
        ort_type: str = node.type
        if ort_type not in ONNX_TO_CONFIG:
            raise ModelLoadError(f"tensor '{self.name}' has type {ort_type}, which modelsvc cannot serve")
        self.data_type = ONNX_TO_CONFIG[ort_type]
        self.dims: list[int] = [d if isinstance(d, int) and d >= 0 else -1 for d in (node.shape or [])]


def _metadata_session(artifact: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(artifact), options, providers=[_CPU])
    except Exception as exc:
        raise ModelLoadError(f"unable to load '{artifact}' with ONNX Runtime: {exc}") from exc


def _complete_tensor(entry: Any, info: _TensorInfo, kind: str, max_batch_size: int, model: str) -> None:
    """Fill data_type and dims of a config input/output of ``model`` from the model; check what is given."""
    model_type = data_type_value(info.data_type)
    if entry.data_type == 0:
        entry.data_type = model_type
    elif entry.data_type != model_type:
        raise ConfigMismatchError(
            f"{kind} '{info.name}' of model '{model}': configuration says {data_type_name(entry.data_type)}, "
            f"the model has {info.data_type}",
            tensor=info.name,
            field="data_type",
        )
    complete_dims(entry, info.dims, kind, info.name, model, max_batch_size, f"model's shape {info.dims}")


def _check_io(config: ModelConfig, session: ort.InferenceSession) -> None:
    """What Triton's ORT backend checks at load: the config's tensors exist with the model's types."""
    for kind, nodes, entries in (
        ("input", session.get_inputs(), config.input),
        ("output", session.get_outputs(), config.output),
    ):
        model = {node.name: node for node in nodes}
        for entry in entries:
            node = model.get(entry.name)
            if node is None:
                raise ModelLoadError(
                    f"configuration {kind} '{entry.name}' is not an {kind} of the model '{config.name}' "
                    f"(the model's {kind}s: {', '.join(model) or 'none'})"
                )
            expected = ONNX_TO_CONFIG.get(node.type)
            if expected is not None and entry.data_type != data_type_value(expected):
                raise ModelLoadError(
                    f"{kind} '{entry.name}' of model '{config.name}': configuration says "
                    f"{data_type_name(entry.data_type)}, the model has {expected}"
                )
    listed = {entry.name for entry in config.input} | sequence_tensors(config)[0]
    missing = [node.name for node in session.get_inputs() if node.name not in listed]
    if missing:
        raise ModelLoadError(
            f"the configuration of model '{config.name}' does not list the model's input(s) {', '.join(missing)}"
        )


def sequence_tensors(config: ModelConfig) -> tuple[set[str], set[str]]:
    """The inputs the sequence batcher feeds (control and state inputs) and the state outputs it keeps: in the
    graph, never listed in the config's ``input``/``output`` (as in Triton's ORT backend)."""
    if not config.HasField("sequence_batching"):
        return set(), set()
    sb = config.sequence_batching
    fed = {entry.name for entry in sb.control_input} | {state.input_name for state in sb.state}
    listed = {entry.name for entry in config.output}  # a state output listed as an output is an output too
    return fed, {state.output_name for state in sb.state} - listed


def _supports_batching(infos: Sequence[_TensorInfo]) -> bool:
    return all(info.dims and info.dims[0] == -1 for info in infos)


def _openvino_instances(config: ModelConfig, artifact: Path, where: list[Placement]) -> list[ModelInstance]:
    """CPU instances on OpenVINO for ``cpu_execution_accelerator { name: "openvino" }`` (imported only then)."""
    try:
        from ..openvino._openvino import onnx_instances
    except ImportError as exc:
        raise ModelLoadError(
            f"model '{config.name}': cpu_execution_accelerator 'openvino' needs OpenVINO ({exc}): "
            "pip install 'modelsvc[openvino]'"
        ) from exc
    return onnx_instances(config, artifact, where)


# --- the backend ------------------------------------------------------------------------------------


class OnnxRuntimeBackend:
    """Loads ``model.onnx`` files into ONNX Runtime sessions, one per model instance."""

    name = "onnxruntime"

    def __init__(self, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        self.default_max_batch_size = default_max_batch_size

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Complete ``config`` from the ONNX graph as Triton's ORT backend does, and check what it gives.

        - ``max_batch_size`` 0 and every model input and output with a dynamic first dimension:
          ``max_batch_size`` becomes the default (4), unless the config already lists both inputs
          and outputs (Triton then leaves the config alone). With ``max_batch_size`` > 1, a model
          that batches and a config without a scheduler get an empty ``dynamic_batching {}``.
        - no outputs listed: all the model's outputs are added; a listed subset is kept as it is.
        - inputs the config leaves out are added (the model cannot run without them); listed
          inputs and outputs without ``data_type`` or ``dims`` are completed.
        - a listed tensor the model lacks, a datatype or shape that disagrees with the model, or
          ``max_batch_size`` > 0 for a model whose first dimension is fixed: ConfigMismatchError.
        """
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' to auto-complete the configuration")
        session = _metadata_session(artifact)
        fed_inputs, kept_outputs = sequence_tensors(config)
        inputs = [_TensorInfo(node) for node in session.get_inputs() if node.name not in fed_inputs]
        outputs = [_TensorInfo(node) for node in session.get_outputs() if node.name not in kept_outputs]
        del session

        can_batch = _supports_batching([*inputs, *outputs])
        if len(config.input) == 0 or len(config.output) == 0:
            if can_batch and config.max_batch_size == 0:
                config.max_batch_size = self.default_max_batch_size
                logger.warning(
                    "auto-completed max_batch_size to %d for model '%s': the model batches and its "
                    "configuration sets no max_batch_size",
                    config.max_batch_size,
                    config.name,
                )
            scheduled = any(
                config.HasField(f) for f in ("dynamic_batching", "sequence_batching", "ensemble_scheduling")
            )
            if can_batch and config.max_batch_size > 1 and not scheduled:
                config.dynamic_batching.SetInParent()
        max_batch_size = config.max_batch_size

        for kind, infos, entries, add_missing in (
            ("input", inputs, config.input, True),
            ("output", outputs, config.output, len(config.output) == 0),
        ):
            by_name = {info.name: info for info in infos}
            listed = set()
            for entry in entries:
                info = by_name.get(entry.name)
                if info is None:
                    names = ", ".join(by_name) or "none"
                    raise ConfigMismatchError(
                        f"configuration {kind} '{entry.name}' is not an {kind} of the model '{config.name}' "
                        f"(the model's {kind}s: {names})",
                        tensor=entry.name,
                        field="name",
                    )
                listed.add(entry.name)
            for info in infos:
                if (
                    max_batch_size > 0
                    and (info.name in listed or add_missing)
                    and not (info.dims and info.dims[0] == -1)
                ):
                    raise ConfigMismatchError(
                        f"max_batch_size of model '{config.name}' is {max_batch_size} but the model's {kind} "
                        f"'{info.name}' has shape {info.dims} with no variable first (batch) dimension; set "
                        "max_batch_size: 0 for a model that does not batch",
                        field="max_batch_size",
                    )
            for entry in entries:
                _complete_tensor(entry, by_name[entry.name], kind, max_batch_size, config.name)
            if add_missing:
                for info in infos:
                    if info.name not in listed:
                        entry = entries.add(name=info.name)
                        _complete_tensor(entry, info, kind, max_batch_size, config.name)

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """One ONNX Runtime session per instance: per ``instance_group`` entry, ``count`` (x each GPU)."""
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' for model '{config.name}' version {version}")
        openvino = _check_cpu_accelerators(config)
        accelerators = gpu_accelerators(config)  # checked for every kind: a bad key fails on any machine
        options = _session_options(config)
        run_options = _run_options(config)
        allow_fallback = _bool_param(config, "allow_cpu_fallback", False)
        try:
            where = placements(config, "onnxruntime")
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        verdicts = onnx_verdicts(artifact)  # one per model: what its shape rules say of inputs that failed a run
        instances: list[ModelInstance] = []
        try:
            if openvino and any(place.gpu is None for place in where):
                instances += _openvino_instances(config, artifact, [p for p in where if p.gpu is None])
                where = [place for place in where if place.gpu is not None]
            for place in where:
                name = place.group if place.total == 1 else f"{place.group}_{place.number}"
                instances.append(
                    self._instance(
                        config, artifact, name, place.gpu, accelerators, options, run_options, allow_fallback, verdicts
                    )
                )
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        return instances

    def _instance(
        self,
        config: ModelConfig,
        artifact: Path,
        name: str,
        gpu: int | None,
        accelerators: GpuAccelerators,
        options: ort.SessionOptions,
        run_options: ort.RunOptions | None,
        allow_fallback: bool,
        verdicts: Verdicts | None = None,
    ) -> OnnxRuntimeInstance:
        wants_trt = gpu is not None and accelerators.tensorrt is not None
        providers: list[ProviderSpec] = [_CPU] if gpu is None else gpu_providers(accelerators, gpu)
        if gpu is not None and _CUDA in ort.get_available_providers():
            preload_cuda_libraries()
        try:
            session = ort.InferenceSession(str(artifact), options, providers=_available(providers))
        except Exception as exc:
            raise ModelLoadError(f"instance '{name}': ONNX Runtime could not load '{artifact}': {exc}") from exc
        try:
            _check_io(config, session)
        except ModelLoadError:
            del session
            raise
        actual = list(session.get_providers())
        device = "cpu"
        if gpu is not None:
            if _CUDA in actual or _TRT in actual:
                device = f"gpu:{gpu}"
                if wants_trt and _TRT not in actual:
                    logger.warning(
                        "instance '%s' of model '%s': the TensorRT execution accelerator is unavailable; running on %s",
                        name,
                        config.name,
                        actual,
                    )
            elif allow_fallback:
                logger.warning(
                    "instance '%s' of model '%s' asked for KIND_GPU (gpu %d) but the CUDA provider is "
                    "unavailable; running on CPU as parameter allow_cpu_fallback permits",
                    name,
                    config.name,
                    gpu,
                )
            else:
                del session
                raise ModelLoadError(
                    f"instance '{name}' of model '{config.name}' asked for KIND_GPU (gpu {gpu}) but the CUDA "
                    f"provider is unavailable (ONNX Runtime would use {actual}); running on CPU would be "
                    "silent. Use instance_group kind KIND_CPU, or set parameters { key: "
                    '"allow_cpu_fallback" value { string_value: "true" } } to accept CPU'
                )
        return OnnxRuntimeInstance(name, device, actual, session, run_options, config.name, verdicts)
