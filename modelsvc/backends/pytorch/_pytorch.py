"""The PyTorch backend: Triton's ``pytorch`` backend (platform ``pytorch_libtorch``) for TorchScript models.

``<model>/<version>/model.pt`` (or ``default_model_filename``) is loaded with ``torch.jit.load`` once per instance,
on the instance's device: ``KIND_CPU``, or ``KIND_GPU`` on ``cuda:N`` for each of its ``gpus`` (``_devices``);
the first CPU instance takes the module that auto-complete loaded to read ``forward()``'s signature.

Tensor names follow Triton's rules. Inputs: when every config input is named after an argument of ``forward()``
they go to those arguments; else, when every name is ``<name>__<index>`` (``INPUT__0``), to the argument at that
index; else in the configuration's order (a name that is an argument at another position is refused rather than
fed to the wrong one). A ``forward()`` that takes a single ``Dict[str, Tensor]`` gets every input in it, keyed by
its config name. Outputs: every name ``<name>__<index>`` picks that element of the returned tuple; else the
configuration's order. ``forward()`` may return a Tensor, a ``List[str]`` or a tuple of those (Triton's rule:
no dict or list of tensors). The config must list the arity ``forward()`` takes; checked at load with the indices.

Datatypes: BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64 as Triton maps them, and BF16 (modelsvc:
``torch.bfloat16``, ml_dtypes arrays on the wire). TYPE_STRING inputs are fed as ``List[str]`` (UTF-8) and a
returned ``List[str]`` is a BYTES output; one dimension in all, as in Triton. A returned tensor whose dtype is not
the config's fails the request (500, logged), as does a scalar.

Triton auto-completes nothing for TorchScript (no tensor metadata), so the config lists every input and output
with data_type and dims. modelsvc adds: a model file may carry its own ``config.pbtxt`` (``torch.jit.save(m, path,
_extra_files={"config.pbtxt": text})`` with ``max_batch_size``, ``input`` and ``output`` only); the config is
then completed from it and checked against it (a datatype or dims that disagree fail the load), like an ONNX model.

Model-config ``parameters`` (string values, ``true``/``false`` also ``on``/``off``, ``1``/``0``; a bad value fails
the load naming the key):

``DISABLE_OPTIMIZED_EXECUTION``
    run without TorchScript's graph optimizations (per instance thread).
``INFERENCE_MODE``
    default true: run under ``torch.inference_mode()``; false: ``torch.no_grad()`` only.
``ENABLE_WEIGHT_SHARING``
    the instances on one device share one loaded module (not for stateful models).
``ENABLE_CACHE_CLEANING``
    ``torch.cuda.empty_cache()`` after every execution of a GPU instance.
``DISABLE_CUDNN``, ``ENABLE_TENSOR_FUSER``, ``ENABLE_JIT_EXECUTOR``, ``ENABLE_JIT_PROFILING``,
``INTRA_OP_THREAD_COUNT``, ``INTER_OP_THREAD_COUNT``
    PyTorch settings that are process-wide: the first model loaded that sets one sets it (as Triton does for the
    thread counts); a later model that asks for another value is logged and runs with the value in effect. Thread
    count 0 keeps PyTorch's default (one thread per core). ``INTER_OP_THREAD_COUNT`` takes effect only before
    PyTorch's first parallel work in the process (a warning says when it is too late).

``NUM_THREADS``, ``NUM_INTEROP_THREADS`` and ``TORCH_COMPILE_OPTIONAL_PARAMETERS`` belong to Triton's PyTorch 2
(``model.py``) runtime, which modelsvc does not have: a warning says so.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._base import ModelConfig, ModelInstance, ModelLoadError
from .._devices import placements
from ._pytorch_instance import PyTorchInstance
from ._pytorch_spec import (
    EMBEDDED_CONFIG,
    STRINGS,
    TENSOR,
    Plan,
    PyTorchOptions,
    Signature,
    complete_from_embedded,
    parse_embedded,
    parse_options,
    plan,
    require_complete,
)

logger = logging.getLogger("modelsvc.backends.pytorch")

#: process-wide PyTorch settings made so far: parameter -> (value, the model that set it)
_GLOBAL_SETTINGS: dict[str, tuple[object, str]] = {}
_GLOBAL_LOCK = threading.Lock()
#: how many modules loaded by auto-complete wait for their model's instances
_PROBES_KEPT = 2


def _set_global(key: str, value: object, model: str, setter: Callable[[Any], Any]) -> None:
    with _GLOBAL_LOCK:
        current = _GLOBAL_SETTINGS.get(key)
        if current is not None:
            if current[0] != value:
                logger.warning(
                    "model '%s': parameter %s=%s is ignored: the setting is process-wide in PyTorch and model '%s' "
                    "set it to %s first",
                    model,
                    key,
                    value,
                    current[1],
                    current[0],
                )
            return
        try:
            setter(value)
        except RuntimeError as exc:
            logger.warning("model '%s': PyTorch refused parameter %s=%s: %s", model, key, value, exc)
            return
        _GLOBAL_SETTINGS[key] = (value, model)
        logger.info("model '%s': PyTorch setting %s=%s (process-wide)", model, key, value)


def _apply_global_options(options: PyTorchOptions, model: str) -> None:
    def cudnn(enabled: bool) -> None:
        torch.backends.cudnn.enabled = enabled

    settings: list[tuple[str, object, Callable[[Any], Any]]] = [
        ("INTRA_OP_THREAD_COUNT", options.intra_op_threads, torch.set_num_threads),
        ("INTER_OP_THREAD_COUNT", options.inter_op_threads, torch.set_num_interop_threads),
        ("DISABLE_CUDNN", None if options.cudnn is None else not options.cudnn, lambda v: cudnn(not v)),
        ("ENABLE_TENSOR_FUSER", options.tensor_fuser, torch._C._jit_set_texpr_fuser_enabled),
        ("ENABLE_JIT_PROFILING", options.jit_profiling, torch._C._jit_set_profiling_mode),
        ("ENABLE_JIT_EXECUTOR", options.jit_executor, torch._C._jit_set_profiling_executor),
    ]
    for key, value, setter in settings:
        if value is not None:
            _set_global(key, value, model, setter)


def _kind(torch_type: Any) -> str:
    kind = torch_type.kind()
    if kind == "TensorType":
        return TENSOR
    if kind == "ListType" and torch_type.getElementType().kind() == "StringType":
        return STRINGS
    if kind == "DictType" and (torch_type.getKeyType().kind(), torch_type.getValueType().kind()) == (
        "StringType",
        "TensorType",
    ):
        return "dict"
    return str(torch_type)


def _signature(module: Any, config: ModelConfig, artifact: Path) -> Signature:
    try:
        schema = module.forward.schema
    except (AttributeError, RuntimeError) as exc:
        raise ModelLoadError(f"model '{config.name}': '{artifact}' has no forward() method: {exc}") from None
    arguments = list(schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    returned: Any = schema.returns[0].type if len(schema.returns) == 1 else None
    is_tuple = returned is not None and returned.kind() == "TupleType"
    returns: tuple[str, ...] = ()
    if is_tuple:
        returns = tuple(_kind(t) for t in returned.elements())
    elif returned is not None:
        returns = (_kind(returned),)
    shown = str(returned) if returned is not None else "nothing"
    if not returns or any(kind not in (TENSOR, STRINGS) for kind in returns):
        raise ModelLoadError(
            f"model '{config.name}': forward() returns {shown}; the pytorch backend (as Triton's) reads a Tensor, a "
            "List[str], or a tuple of those"
        )
    return Signature(
        arguments=tuple((a.name, _kind(a.type)) for a in arguments),
        returns=returns,
        returns_tuple=is_tuple,
        return_type=shown,
    )


def _load(artifact: Path, device: torch.device, config: ModelConfig) -> tuple[Any, bytes]:
    """The module on ``device`` and the ``config.pbtxt`` it carries (empty when none)."""
    extra: dict[str, Any] = {EMBEDDED_CONFIG: b""}
    try:
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript, which is what Triton's backend serves
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(artifact), map_location=device, _extra_files=extra)  # type: ignore[no-untyped-call]
    except Exception as exc:  # torch raises RuntimeError, ValueError, pickle errors ... for a file it cannot read
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"model '{config.name}': '{artifact}' is not a TorchScript model that torch.jit.load can read "
            f"(save one with torch.jit.script(model).save(path) or torch.jit.trace): {detail}"
        ) from None
    text = extra[EMBEDDED_CONFIG]
    return module, text.encode() if isinstance(text, str) else bytes(text)


class PyTorchBackend:
    """Loads ``model.pt`` TorchScript files with ``torch.jit.load``, one module per instance (or per device with
    ``ENABLE_WEIGHT_SHARING``)."""

    name = "pytorch"

    def __init__(self) -> None:
        # the module each recent auto-complete loaded on the CPU, handed to the model's first CPU instance so that
        # the file is not read twice: (path, mtime, size) -> (module, embedded config); at most _PROBES_KEPT
        self._probes: OrderedDict[tuple[str, int, int], tuple[Any, bytes]] = OrderedDict()
        self._probes_lock = threading.Lock()

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Complete ``config`` from the ``config.pbtxt`` the model file carries, if any (else require it complete),
        and check it against ``forward()``'s arguments and return type."""
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' to auto-complete the configuration")
        key = _file_key(artifact)
        module, text = _load(artifact, torch.device("cpu"), config)
        if text:
            complete_from_embedded(config, parse_embedded(config, text, str(artifact)))
        else:
            require_complete(config)
        plan(config, _signature(module, config, artifact))
        with self._probes_lock:
            self._probes[key] = (module, text)
            while len(self._probes) > _PROBES_KEPT:
                self._probes.popitem(last=False)

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """One module per instance: per ``instance_group`` entry, ``count`` (x each GPU)."""
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' for model '{config.name}' version {version}")
        options = parse_options(config)
        require_complete(config)
        try:
            where = placements(config, "pytorch")
        except ValueError as exc:
            raise ModelLoadError(f"model '{config.name}': {exc}") from None
        for place in where:
            if place.gpu is not None:
                _check_gpu(config, place.group, place.gpu)
        _apply_global_options(options, config.name)
        with self._probes_lock:
            probe = self._probes.pop(_file_key(artifact), None)
        io: Plan | None = None
        shared: dict[str, Any] = {}
        instances: list[ModelInstance] = []
        try:
            for place in where:
                device = torch.device("cpu") if place.gpu is None else torch.device("cuda", place.gpu)
                module = shared.get(str(device)) if options.weight_sharing else None
                if module is None:
                    if probe is not None and device.type == "cpu":
                        (module, text), probe = probe, None
                    else:
                        module, text = _load(artifact, device, config)
                    io = io or self._check(config, module, text, artifact)
                    shared[str(device)] = module
                assert io is not None
                name = place.group if place.total == 1 else f"{place.group}_{place.number}"
                instances.append(
                    PyTorchInstance(name, config.name, device, module, io, options, config.max_batch_size > 0)
                )
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        return instances

    @staticmethod
    def _check(config: ModelConfig, module: Any, text: bytes, artifact: Path) -> Plan:
        if text:  # a config that skipped auto-complete (--strict-model-config) is still checked against the file
            copy = ModelConfig()
            copy.CopyFrom(config)
            complete_from_embedded(copy, parse_embedded(config, text, str(artifact)))
        if getattr(module, "training", False):
            logger.warning(
                "model '%s': '%s' was saved in training mode: any dropout or batch norm in it behaves as in training "
                "(Triton runs it as saved); call model.eval() before saving",
                config.name,
                artifact,
            )
        return plan(config, _signature(module, config, artifact))


def _file_key(artifact: Path) -> tuple[str, int, int]:
    stat = artifact.stat()
    return str(artifact.resolve()), stat.st_mtime_ns, stat.st_size


def _check_gpu(config: ModelConfig, group: str, gpu: int) -> None:
    if not torch.cuda.is_available():
        raise ModelLoadError(
            f"instance group '{group}' of model '{config.name}' asks for GPU {gpu}, but PyTorch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'}): use kind: KIND_CPU"
        )
    count = torch.cuda.device_count()
    if gpu >= count:
        raise ModelLoadError(
            f"instance group '{group}' of model '{config.name}' asks for GPU {gpu}, but PyTorch sees {count} "
            f"CUDA device(s)"
        )
