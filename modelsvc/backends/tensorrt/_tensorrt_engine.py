"""A TensorRT plan on one GPU: the only TensorRT and CUDA code of the backend (it runs only where both are).

Written against TensorRT's Python API as of 10.x/11.x (the name-based tensor API) and cuda-python's
``cuda.bindings.runtime`` (cudart); never torch, never pycuda. Everything decided without the GPU (datatypes,
profiles, shape checks, error texts) is in ``_tensorrt_spec``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorrt as trt
from cuda.bindings import runtime as cudart

from .._base import ModelLoadError
from ._tensorrt_logger import capture, shared_logger
from ._tensorrt_spec import (
    EngineDescription,
    EngineProfile,
    EngineTensor,
    InputShapesRejected,
    config_datatype,
    deserialize_failure_message,
)

logger = logging.getLogger("modelsvc.backends.tensorrt")

#: Triton config type -> numpy dtype of the host buffers
_NUMPY = {
    "TYPE_FP32": np.float32,
    "TYPE_FP16": np.float16,
    "TYPE_INT8": np.int8,
    "TYPE_UINT8": np.uint8,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_BOOL": np.bool_,
}
_MIN_BYTES = 256
INSTALL_HINT = "pip install 'modelsvc[tensorrt]'"


def _check(result: Any) -> Any:
    """cudart calls return (error, *values): raise on an error, return the value (or values)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        raise RuntimeError(f"CUDA error {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _numpy_dtype(tensor: EngineTensor) -> Any:
    if tensor.datatype == "TYPE_BF16":
        try:
            import ml_dtypes
        except ImportError:
            raise ModelLoadError(
                f"tensor '{tensor.name}' is BF16, which needs ml_dtypes (numpy's bfloat16), not installed: "
                f"{INSTALL_HINT}"
            ) from None
        return np.dtype(ml_dtypes.bfloat16)
    if tensor.datatype not in _NUMPY:
        raise ModelLoadError(f"tensor '{tensor.name}' has TensorRT type {tensor.datatype}, which modelsvc cannot serve")
    return np.dtype(_NUMPY[tensor.datatype])


def describe_engine(engine: Any) -> EngineDescription:
    """An engine's I/O tensors and optimization profiles, read through the name-based tensor API."""
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        tensors.append(
            EngineTensor(
                name=name,
                is_input=engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                datatype=config_datatype(engine.get_tensor_dtype(name).name),
                dims=tuple(int(d) for d in engine.get_tensor_shape(name)),
            )
        )
    profiles = []
    for profile in range(engine.num_optimization_profiles):
        shapes = {}
        for tensor in tensors:
            if not tensor.is_input:
                continue
            if -1 in tensor.dims:
                low, opt, high = engine.get_tensor_profile_shape(tensor.name, profile)
                shapes[tensor.name] = (tuple(map(int, low)), tuple(map(int, opt)), tuple(map(int, high)))
            else:
                shapes[tensor.name] = (tensor.dims, tensor.dims, tensor.dims)
        profiles.append(EngineProfile(shapes))
    return EngineDescription(tuple(tensors), tuple(profiles), str(trt.__version__))


class _DeviceBuffer:
    """Device memory grown on demand and reused."""

    def __init__(self) -> None:
        self.ptr = 0
        self.size = 0

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.size:
            self.free()
            size = max(nbytes, _MIN_BYTES)
            self.ptr = int(_check(cudart.cudaMalloc(size)))
            self.size = size
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            _check(cudart.cudaFree(self.ptr))
        self.ptr, self.size = 0, 0


class _HostBuffer:
    """Pinned (page-locked) host memory for staging copies, grown on demand and reused."""

    def __init__(self) -> None:
        self.ptr = 0
        self.size = 0

    def ensure(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        if nbytes > self.size:
            self.free()
            size = max(nbytes, _MIN_BYTES)
            self.ptr = int(_check(cudart.cudaMallocHost(size)))
            self.size = size
        return np.ctypeslib.as_array((ctypes.c_uint8 * self.size).from_address(self.ptr))[:nbytes]

    def free(self) -> None:
        if self.ptr:
            _check(cudart.cudaFreeHost(self.ptr))
        self.ptr, self.size = 0, 0


class _OutputAllocator(trt.IOutputAllocator):  # type: ignore[misc]
    """Memory for an output whose shape depends on the data: TensorRT asks for it and reports the shape."""

    def __init__(self) -> None:
        trt.IOutputAllocator.__init__(self)
        self.buffer = _DeviceBuffer()
        self.shape: tuple[int, ...] = ()

    def reallocate_output(self, tensor_name: str, memory: Any, size: int, alignment: int) -> int:
        return self.buffer.ensure(size)

    def reallocate_output_async(self, tensor_name: str, memory: Any, size: int, alignment: int, stream: Any) -> int:
        return self.buffer.ensure(size)

    def notify_shape(self, tensor_name: str, shape: Any) -> None:
        self.shape = tuple(int(d) for d in shape)


class PlanEngine:
    """A deserialized plan on GPU ``device`` with one execution context on optimization profile ``profile``,
    one CUDA stream, pinned host staging buffers and device buffers grown on demand and reused.

    ``infer`` is not reentrant (a lock serialises callers); ``close`` frees everything and is idempotent.
    """

    def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._closed = False
        self._stream: Any = None
        self._host: dict[str, _HostBuffer] = {}
        self._gpu: dict[str, _DeviceBuffer] = {}
        self._allocators: dict[str, _OutputAllocator] = {}
        _check(cudart.cudaSetDevice(device))
        self._logger = shared_logger(trt)  # the process's one logger (_tensorrt_logger): TensorRT keeps only one
        with capture() as log:
            self._runtime = trt.Runtime(self._logger)
            engine = self._runtime.deserialize_cuda_engine(plan)
        if engine is None:
            major = _check(
                cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device)
            )
            minor = _check(
                cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device)
            )
            raise ModelLoadError(
                deserialize_failure_message(
                    trt_version=str(trt.__version__),
                    device=device,
                    compute_capability=(int(major), int(minor)),
                    log=log.errors[-20:],
                )
            )
        self._engine = engine
        self.description = describe_engine(engine)
        if not 0 <= profile < len(self.description.profiles):
            raise ModelLoadError(
                f"optimization profile {profile} does not exist: the engine has {len(self.description.profiles)}"
            )
        self.profile = profile
        self._dtypes = {t.name: _numpy_dtype(t) for t in self.description.tensors}
        with capture() as log:
            context = engine.create_execution_context()
        if context is None:
            raise ModelLoadError(
                f"TensorRT could not create an execution context on GPU {device} (out of memory?){_said(log.errors)}"
            )
        self._context = context
        # plans are built with DETAILED profiling verbosity (for the inspector); NVTX ranges that detailed slow
        # every enqueueV3 down, and a served engine needs only the layer names
        context.nvtx_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
        self._stream = _check(cudart.cudaStreamCreate())
        self._stream_handle = int(self._stream)
        try:
            with capture() as log:
                context.set_optimization_profile_async(profile, self._stream_handle)  # raises, never returns False
        except RuntimeError as exc:
            self.close()
            raise ModelLoadError(
                f"TensorRT could not select optimization profile {profile}: {exc}{_said(log.errors)}"
            ) from None
        _check(cudart.cudaStreamSynchronize(self._stream))
        # outputs whose shape stays unknown once the inputs' shapes are set depend on the data: allocator
        for name, (_, opt, _) in self.description.profiles[profile].shapes.items():
            context.set_input_shape(name, opt)
        for tensor in self.description.outputs:
            if any(d < 0 for d in context.get_tensor_shape(tensor.name)):
                allocator = self._allocators[tensor.name] = _OutputAllocator()
                context.set_output_allocator(tensor.name, allocator)

    def infer(
        self, feeds: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run the engine on ``feeds`` (every input, by name); the ``outputs`` asked for (None or empty: every
        output) as new numpy arrays. Every output has its device buffer (TensorRT writes them all), but only those
        asked for are copied to the host, each straight into the array returned."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the plan engine is closed")
            wanted = self._wanted(outputs)
            _check(cudart.cudaSetDevice(self._device))
            context, stream = self._context, self._stream
            for tensor in self.description.inputs:
                if tensor.name not in feeds:
                    raise ValueError(f"input '{tensor.name}' is missing")
                array = np.ascontiguousarray(feeds[tensor.name], dtype=self._dtypes[tensor.name])
                if not context.set_input_shape(tensor.name, array.shape):
                    raise ValueError(f"TensorRT refused shape {list(array.shape)} for input '{tensor.name}'")
                host = self._host.setdefault(tensor.name, _HostBuffer()).ensure(array.nbytes)
                host[:] = array.reshape(-1).view(np.uint8)
                device = self._gpu.setdefault(tensor.name, _DeviceBuffer()).ensure(array.nbytes)
                _check(cudart.cudaMemcpyAsync(device, host.ctypes.data, array.nbytes, _H2D, stream))
                context.set_tensor_address(tensor.name, device)
            with capture() as log:  # shapes that fit the profile one by one may not fit each other
                try:
                    context.infer_shapes()
                except RuntimeError as exc:
                    _check(cudart.cudaStreamSynchronize(stream))  # the inputs' copies read the host buffers
                    raise InputShapesRejected(" | ".join(log.errors[-3:]) or str(exc)) from exc
            shapes: dict[str, tuple[int, ...]] = {}
            for tensor in self.description.outputs:
                if tensor.name in self._allocators:
                    continue
                shape = tuple(int(d) for d in context.get_tensor_shape(tensor.name))
                shapes[tensor.name] = shape
                nbytes = int(np.prod(shape)) * self._dtypes[tensor.name].itemsize
                context.set_tensor_address(
                    tensor.name, self._gpu.setdefault(tensor.name, _DeviceBuffer()).ensure(nbytes)
                )
            with capture() as log:
                ran = context.execute_async_v3(self._stream_handle)
            if not ran:
                _check(cudart.cudaStreamSynchronize(stream))
                raise RuntimeError("TensorRT execute_async_v3 failed" + _said(log.errors[-3:]))
            results: dict[str, np.ndarray[Any, Any]] = {}
            for name in wanted:
                allocator = self._allocators.get(name)
                if allocator is not None:  # TensorRT reports the shape before execute_async_v3 returns
                    shapes[name] = allocator.shape
                    source = allocator.buffer.ptr
                else:
                    source = self._gpu[name].ptr
                result = results[name] = np.empty(shapes[name], self._dtypes[name])
                if result.nbytes:
                    _check(cudart.cudaMemcpyAsync(result.ctypes.data, source, result.nbytes, _D2H, stream))
            _check(cudart.cudaStreamSynchronize(stream))
            return results

    def _wanted(self, outputs: Sequence[str] | None) -> list[str]:
        names = [t.name for t in self.description.outputs]
        if not outputs:
            return names
        unknown = [name for name in outputs if name not in names]
        if unknown:
            raise ValueError(f"the engine has no output {', '.join(map(repr, unknown))} (it has {', '.join(names)})")
        return list(dict.fromkeys(outputs))

    def close(self) -> None:
        """Free the buffers, the stream, the context and the engine (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                _check(cudart.cudaSetDevice(self._device))
                if self._stream is not None:
                    _check(cudart.cudaStreamSynchronize(self._stream))
                for host in self._host.values():
                    host.free()
                for device in [*self._gpu.values(), *(a.buffer for a in self._allocators.values())]:
                    device.free()
                if self._stream is not None:
                    _check(cudart.cudaStreamDestroy(self._stream))
            finally:
                self._stream = None
                self.__dict__.pop("_context", None)
                self.__dict__.pop("_engine", None)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):  # interpreter shutdown: CUDA may be gone already
                self.close()


def _said(errors: Sequence[str]) -> str:
    """TensorRT's own errors, as the end of a message."""
    return ": " + " | ".join(errors) if errors else ""


_H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
_D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

__all__ = ["PlanEngine", "describe_engine"]
