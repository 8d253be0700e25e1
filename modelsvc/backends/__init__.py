"""Backends: what turns a model artifact into instances that execute batches.

A backend is registered by name in :data:`BACKENDS` (a factory, so heavy imports stay lazy). A model
config names its backend with ``backend`` or ``platform`` (Triton's names); :func:`get_backend` picks it.
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


def _onnxruntime() -> Backend:
    from ._onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def _python() -> Backend:
    from ._python import PythonBackend

    return PythonBackend()


#: backend name -> factory. Add python, ensemble, tensorrt, ... here as they are written.
BACKENDS: dict[str, Callable[[], Backend]] = {
    "onnxruntime": _onnxruntime,
    "python": _python,
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
    "ModelConfig",
    "ModelInstance",
    "ModelLoadError",
    "RequestsInstance",
    "backend_name",
    "bind_inprocess",
    "get_backend",
    "visible_gpus",
]
