"""A stand-in of ``tensorrt`` and ``cuda.bindings.runtime`` for the GPU-only module of the tensorrt backend
(``_tensorrt_engine``), shared by its tests: host memory behind the "device" pointers, an add/sub engine with a
data-dependent output. It checks our logic, not TensorRT's API; where the real API has a habit our code must cope
with, the stand-in has it too:

- one logger per process: the first logger given to any ``Runtime`` is the one every later ``Runtime`` logs
  through, as TensorRT's ("TensorRT maintains only a single logger pointer at any given time");
- ``set_optimization_profile_async`` raises RuntimeError on failure (pyCore.cpp's ``PY_ASSERT_RUNTIME_ERROR``),
  it never returns False;
- ``infer_shapes`` raises RuntimeError with only an error code (pyCore.cpp) when shape inference fails, TensorRT's
  words going to the logger;
- every cudaMemcpyAsync is recorded with its direction, size and destination.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import modelsvc.backends.tensorrt

ENGINE_MODULE = "modelsvc.backends.tensorrt._tensorrt_engine"


class Memory:
    """What the stand-in cudart allocated and freed, with real host addresses behind every pointer; and the knobs
    of the stand-in tensorrt."""

    def __init__(self) -> None:
        self.device: dict[int, Any] = {}
        self.host: dict[int, Any] = {}
        self.mallocs = 0
        self.calls: list[tuple[str, Any]] = []
        #: set_optimization_profile_async raises this message (None: it succeeds)
        self.profile_error: str | None = None
        #: execute_async_v3 logs this error and returns False (None: it runs)
        self.execute_error: str | None = None
        #: the execution contexts made, in order
        self.contexts: list[Context] = []

    def copies(self, kind: str) -> list[tuple[int, int]]:
        """(bytes, destination) of every cudaMemcpyAsync of ``kind`` ("cudaMemcpyDeviceToHost", ...)."""
        return [(args[1], args[2]) for name, args in self.calls if name == "cudaMemcpyAsync" and args[0] == kind]


def view(address: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
    count = int(np.prod(shape)) * np.dtype(dtype).itemsize
    array: np.ndarray[Any, Any] = np.frombuffer(memoryview((ctypes.c_char * count).from_address(address)), dtype)
    return array.reshape(shape)


def standin_cudart(memory: Memory) -> types.ModuleType:
    rt = types.ModuleType("cuda.bindings.runtime")
    ok: Any = enum.Enum("ok", {"cudaSuccess": 0, "cudaErrorMemoryAllocation": 2})
    vars(rt)["cudaError_t"] = ok
    vars(rt)["cudaMemcpyKind"] = enum.Enum("cudaMemcpyKind", {"cudaMemcpyHostToDevice": 1, "cudaMemcpyDeviceToHost": 2})
    vars(rt)["cudaDeviceAttr"] = enum.Enum(
        "cudaDeviceAttr", {"cudaDevAttrComputeCapabilityMajor": 75, "cudaDevAttrComputeCapabilityMinor": 76}
    )
    success = ok.cudaSuccess

    def alloc(table: dict[int, Any]) -> Any:
        def malloc(size: int) -> tuple[Any, int]:
            buffer = ctypes.create_string_buffer(size)
            table[ctypes.addressof(buffer)] = buffer
            memory.mallocs += 1
            return success, ctypes.addressof(buffer)

        return malloc

    def free(table: dict[int, Any]) -> Any:
        def release(ptr: int) -> tuple[Any]:
            del table[ptr]  # a double free or a foreign pointer fails the test
            return (success,)

        return release

    class Stream:
        def __int__(self) -> int:
            return 4242

    def record(name: str, result: Any = None) -> Any:
        def call(*args: Any) -> Any:
            memory.calls.append((name, args))
            return (success,) if result is None else (success, result)

        return call

    def memcpy(dst: int, src: int, count: int, kind: Any, stream: Any) -> tuple[Any]:
        ctypes.memmove(dst, src, count)
        memory.calls.append(("cudaMemcpyAsync", (kind.name, count, dst)))
        return (success,)

    vars(rt)["cudaMalloc"] = alloc(memory.device)
    vars(rt)["cudaMallocHost"] = alloc(memory.host)
    vars(rt)["cudaFree"] = free(memory.device)
    vars(rt)["cudaFreeHost"] = free(memory.host)
    vars(rt)["cudaMemcpyAsync"] = memcpy
    vars(rt)["cudaSetDevice"] = record("cudaSetDevice")
    vars(rt)["cudaStreamCreate"] = record("cudaStreamCreate", Stream())
    vars(rt)["cudaStreamSynchronize"] = record("cudaStreamSynchronize")
    vars(rt)["cudaStreamDestroy"] = record("cudaStreamDestroy")
    vars(rt)["cudaDeviceGetAttribute"] = lambda attr, device: (success, 9 if attr.value == 75 else 0)
    vars(rt)["cudaGetErrorName"] = lambda err: (success, err.name.encode())
    return rt


class Severity(enum.Enum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3


class ILogger:
    Severity = Severity

    def __init__(self) -> None:
        pass


class IOutputAllocator:
    def __init__(self) -> None:
        pass


TensorIOMode = enum.Enum("TensorIOMode", ["INPUT", "OUTPUT"])
DataType = enum.Enum("DataType", ["FLOAT", "INT64"])
ProfilingVerbosity = enum.Enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "DETAILED", "NONE"])
#: name -> (mode, dtype, engine shape); NONZERO (indices of INPUT0's positive elements) depends on the data
TENSORS = {
    "INPUT0": (TensorIOMode.INPUT, DataType.FLOAT, (-1, -1)),
    "INPUT1": (TensorIOMode.INPUT, DataType.FLOAT, (-1, -1)),
    "OUTPUT0": (TensorIOMode.OUTPUT, DataType.FLOAT, (-1, -1)),
    "NONZERO": (TensorIOMode.OUTPUT, DataType.INT64, (-1,)),
}
PROFILES = [((1, 1), (4, 8), (8, 64)), ((1, 1), (1, 4), (2, 4))]


class Context:
    def __init__(self, memory: Memory, logger: Any) -> None:
        self.memory = memory
        self.logger = logger
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.allocators: dict[str, Any] = {}
        #: what the engine was built with, until the engine sets another
        self.nvtx_verbosity = ProfilingVerbosity.DETAILED
        memory.contexts.append(self)

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        self.memory.calls.append(("set_optimization_profile_async", (profile, stream)))
        if self.memory.profile_error is not None:
            self.logger.log(Severity.ERROR, self.memory.profile_error)
            raise RuntimeError("Error in set optimization profile async.")
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        self.shapes[name] = tuple(shape)
        return True

    def infer_shapes(self) -> list[str]:
        """As pyCore.cpp's binding: a failed shape inference (here: an add of two shapes that differ) is logged by
        TensorRT and raised as RuntimeError with only the error code; insufficiently specified inputs are returned."""
        missing = [
            name for name, (mode, _, _) in TENSORS.items() if mode is TensorIOMode.INPUT and name not in self.shapes
        ]
        if missing:
            return missing
        if self.shapes["INPUT0"] != self.shapes["INPUT1"]:
            self.logger.log(
                Severity.ERROR,
                "IExecutionContext::inferShapes: Error Code 7: Internal Error (OUTPUT0: dimensions not compatible "
                f"for elementwise: {list(self.shapes['INPUT0'])} and {list(self.shapes['INPUT1'])})",
            )
            raise RuntimeError("infer_shapes error code: -1")
        return []

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if name == "OUTPUT0":
            return self.shapes.get("INPUT0", (-1, -1))
        return self.shapes.get(name, TENSORS[name][2])

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address

    def set_output_allocator(self, name: str, allocator: Any) -> None:
        self.allocators[name] = allocator

    def execute_async_v3(self, stream: int) -> bool:
        if self.memory.execute_error is not None:
            self.logger.log(Severity.ERROR, self.memory.execute_error)
            return False
        a = view(self.addresses["INPUT0"], self.shapes["INPUT0"], np.float32)
        b = view(self.addresses["INPUT1"], self.shapes["INPUT1"], np.float32)
        np.copyto(view(self.addresses["OUTPUT0"], a.shape, np.float32), a + b)
        nonzero = np.flatnonzero(a > 0).astype(np.int64)
        allocator = self.allocators["NONZERO"]
        address = allocator.reallocate_output_async("NONZERO", 0, nonzero.nbytes, 256, stream)
        np.copyto(view(address, nonzero.shape, np.int64), nonzero)
        allocator.notify_shape("NONZERO", nonzero.shape)
        return True


class Engine:
    num_io_tensors = len(TENSORS)
    num_optimization_profiles = len(PROFILES)

    def __init__(self, memory: Memory, logger: Any) -> None:
        self.memory = memory
        self.logger = logger

    def get_tensor_name(self, index: int) -> str:
        return list(TENSORS)[index]

    def get_tensor_mode(self, name: str) -> Any:
        return TENSORS[name][0]

    def get_tensor_dtype(self, name: str) -> Any:
        return TENSORS[name][1]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return TENSORS[name][2]

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        return list(PROFILES[profile])

    def create_execution_context(self) -> Context:
        return Context(self.memory, self.logger)


INCOMPATIBLE = (
    "The engine plan file is not compatible with this version of TensorRT, expecting library version 10.99 got "
    "8.6.1.6, please rebuild."
)


def standin_tensorrt(memory: Memory) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    vars(trt)["__version__"] = "10.99-standin"
    kept: list[Any] = []  # the process's one logger: the first one given

    def process_logger(logger: Any) -> Any:
        if not kept:
            kept.append(logger)
        return kept[0]

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = process_logger(logger)

        def deserialize_cuda_engine(self, plan: bytes) -> Engine | None:
            if plan == b"standin":
                return Engine(memory, self.logger)
            self.logger.log(Severity.ERROR, INCOMPATIBLE)
            return None

    for name, value in {
        "Runtime": Runtime,
        "ILogger": ILogger,
        "IOutputAllocator": IOutputAllocator,
        "TensorIOMode": TensorIOMode,
        "ProfilingVerbosity": ProfilingVerbosity,
        "process_logger": process_logger,
    }.items():
        setattr(trt, name, value)
    return trt


@contextmanager
def engine_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Memory]]:
    """``_tensorrt_engine`` imported against the stand-ins; removed again afterwards."""
    memory = Memory()
    rt = standin_cudart(memory)
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    vars(bindings)["runtime"] = rt
    vars(cuda)["bindings"] = bindings
    for name, module in {"tensorrt": standin_tensorrt(memory), "cuda": cuda, "cuda.bindings": bindings}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", rt)
    sys.modules.pop(ENGINE_MODULE, None)
    try:
        yield importlib.import_module(ENGINE_MODULE), memory
    finally:
        sys.modules.pop(ENGINE_MODULE, None)
        vars(modelsvc.backends.tensorrt).pop("_tensorrt_engine", None)
