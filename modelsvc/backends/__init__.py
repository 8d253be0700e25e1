"""Backends: what turns a model artifact into instances that execute batches.

A model config names its backend with ``backend`` or ``platform`` (Triton's names); :func:`get_backend` picks it.

Adding a backend (the TensorRT, PyTorch and OpenVINO backends were added this way):

- Implement the protocols of ``_base.py`` in a folder of its own, ``<name>/_<name>.py`` (split into
  ``<name>/_<name>_*.py`` modules as it grows; ``<name>/__init__.py`` says what lives there):
  ``Backend`` (``name``, ``autocomplete(config, artifact)``, ``create_instances(config, artifact, version)``,
  placing instances with ``_devices.placements``) and ``ModelInstance`` (``execute`` runs one batch on its
  worker thread, never twice at once; BYTES are object arrays of ``bytes``). An instance that wants a batch's
  requests one by one also has ``RequestsInstance.execute_requests``, as the python backend does.
- Register it: a factory in :data:`BACKENDS` that imports the module inside the function, so that the heavy
  library loads only when a model asks for the backend; when the import fails, the factory raises
  ``ModelLoadError("backend 'tensorrt' needs TensorRT: pip install 'modelsvc[tensorrt]'")`` (the extra named
  in pyproject.toml) from the ImportError, and the repository shows it at the model's ``backend`` line.
  Also: its Triton ``platform`` in :data:`PLATFORM_BACKENDS` (and :data:`BACKEND_PLATFORMS` where Triton shows
  one in GET /config), its model file in :data:`DEFAULT_MODEL_FILENAMES`.
- Bad config: a config that disagrees with the artifact raises ``ConfigMismatchError`` (``tensor=`` and
  ``field=`` let the repository point at the line of config.pbtxt), anything else that stops a load
  ``ModelLoadError``; the message names the model and the tensor (the ONNX Runtime backend:
  ``input 'INPUT0' of model 'm': configuration says TYPE_INT32, the model has TYPE_FP32``).
- Bad tensors at request time: the data plane checks datatype, shape and batch size against the config before
  ``execute`` (HTTP 400, gRPC INVALID_ARGUMENT, naming the tensor). What only the backend sees it raises as
  ``modelsvc.protocol.InvalidArgument``, naming the tensor where it knows it, the same 400 / INVALID_ARGUMENT:
  the ONNX Runtime backend for ORT's own INVALID_ARGUMENT (``onnx runtime error: ...``) and for BYTES that are
  not UTF-8 (``input 'X': ...``); a python model answers ``TritonError(..., TritonError.INVALID_ARG)``. A
  closed instance raises ``Unavailable`` (503, UNAVAILABLE).
- Inputs that each fit the config but not each other (add_sub's INPUT0 [2,3] with INPUT1 [2,4]) raise
  ``InputsMismatch`` (``_shapes.py``: a 400 / INVALID_ARGUMENT, ``inputs INPUT0 [2,3] and INPUT1 [2,4] do not fit
  model 'm': <why>``), decided from the runtime's own signal, never from any failure: ONNX Runtime by the graph's
  named dimensions before the run and ONNX's strict shape inference after a failed one, OpenVINO by reshaping
  the model to the inputs' shapes after a failed inference, TensorRT by ``infer_shapes`` raising, PyTorch (no
  declared shapes, no error class) by the wording of ATen's shape checks. A python model's own exception stays
  a 500, as Triton answers it; the model reports a bad request with ``TritonError.INVALID_ARG``.
- Any other failure of the runtime is ``InternalError`` or any other exception: the scheduler answers 500 /
  INTERNAL with a fixed message naming the model and logs the detail.
- Tests: add one ``BackendCase`` to ``BACKEND_CASES`` in tests/backends/test_backend_contract.py (loading, execution,
  bad config, a real server over HTTP and gRPC, batching, bad requests) and keep what is the backend's own
  (providers, options, its datatypes) in its own tests/test_<name>_backend.py; tests/test_import_graph.py
  must stay green (no import cycles).
"""

from __future__ import annotations

from collections.abc import Callable

from ._base import (
    Arrays,
    Backend,
    BatchRequest,
    ConfigMismatchError,
    ModelConfig,
    ModelInstance,
    ModelLoadError,
    RequestsInstance,
)
from ._devices import visible_gpus
from ._inprocess import bind as bind_inprocess
from ._shapes import InputsMismatch


def _onnxruntime() -> Backend:
    from .onnxruntime._onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def _python() -> Backend:
    from .python._python import PythonBackend

    return PythonBackend()


def _pytorch() -> Backend:
    from .pytorch._pytorch_spec import passive_openmp

    passive_openmp()  # before torch loads: see its docstring
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as exc:
        raise ModelLoadError(f"backend 'pytorch' needs PyTorch ({exc}): pip install 'modelsvc[pytorch]'") from exc
    from .pytorch._pytorch import PyTorchBackend

    return PyTorchBackend()


def _tensorrt() -> Backend:
    try:
        from .tensorrt._tensorrt_engine import PlanEngine
    except (ImportError, OSError) as exc:
        raise ModelLoadError(
            f"backend 'tensorrt' needs TensorRT and cuda-python ({exc}): pip install 'modelsvc[tensorrt]'"
        ) from exc
    from .tensorrt._tensorrt import TensorRTBackend

    return TensorRTBackend(PlanEngine)


def _openvino() -> Backend:
    try:
        from .openvino._openvino import OpenVINOBackend
    except ImportError as exc:
        raise ModelLoadError(f"backend 'openvino' needs OpenVINO ({exc}): pip install 'modelsvc[openvino]'") from exc
    return OpenVINOBackend()


#: backend name -> factory (pytorch and openvino join here as they are written; see the docstring)
BACKENDS: dict[str, Callable[[], Backend]] = {
    "onnxruntime": _onnxruntime,
    "python": _python,
    "pytorch": _pytorch,
    "tensorrt": _tensorrt,
    "openvino": _openvino,
}

#: Triton ``platform`` -> backend name (every platform Triton knows, supported here or not)
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "openvino": "openvino",
    "ensemble": "ensemble",
}

#: backend name -> the ``platform`` Triton shows for it in GET /config (backends not listed show none)
BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
    "pytorch": "pytorch_libtorch",
}

#: backend name -> the model file looked for in ``<model>/<version>/`` without ``default_model_filename``
DEFAULT_MODEL_FILENAMES: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "tensorrt": "model.plan",
    "python": "model.py",
    "pytorch": "model.pt",
    "tensorflow": "model.savedmodel",
    "openvino": "model.xml",
}

_instances: dict[str, Backend] = {}


def backend_name(config: ModelConfig) -> str | None:
    """The backend a config names through ``backend`` or ``platform``; None when it names neither."""
    if config.backend:
        return str(config.backend)
    if config.platform:
        return PLATFORM_BACKENDS.get(config.platform, str(config.platform))
    return None


def get_backend(config: ModelConfig) -> Backend:
    """The (shared) backend for ``config``; ModelLoadError naming the backend when none is registered."""
    name = backend_name(config)
    if name is None:
        raise ModelLoadError("the model configuration names no platform or backend")
    backend = _instances.get(name)
    if backend is None:
        factory = BACKENDS.get(name)
        if factory is None:
            supported = ", ".join(sorted(BACKENDS))
            raise ModelLoadError(f"backend '{name}' is not supported by modelsvc (supported: {supported})")
        backend = _instances[name] = factory()
    return backend


__all__ = [
    "BACKENDS",
    "BACKEND_PLATFORMS",
    "DEFAULT_MODEL_FILENAMES",
    "PLATFORM_BACKENDS",
    "Arrays",
    "Backend",
    "BatchRequest",
    "ConfigMismatchError",
    "InputsMismatch",
    "ModelConfig",
    "ModelInstance",
    "ModelLoadError",
    "RequestsInstance",
    "backend_name",
    "bind_inprocess",
    "get_backend",
    "visible_gpus",
]
