"""PlanEngine's CUDA half on a real GPU, with a stand-in of TensorRT: a check for a GPU machine without TensorRT.

    PYTHONPATH=. python loadtests/gpu/plan_engine_cuda.py

``modelsvc.backends.tensorrt._tensorrt_engine`` runs with the machine's own ``cuda.bindings.runtime`` (cudart) and a
stand-in ``tensorrt`` module whose engine copies each input to its output (``execute_async_v3`` does a device to
device ``cudaMemcpyAsync`` on the stream it is given). That checks, on real CUDA: ``_check``'s handling of cudart's
``(error, value...)`` tuples and its error names, ``int(stream)`` handed to TensorRT, pinned host buffers and device
buffers (cudaPointerGetAttributes), the copy directions, the stream synchronized after the profile switch and
before the host reads, that only the outputs asked for are copied back, buffers grown and reused, everything freed
on close, and TensorRT's error text reaching the engine through the one logger; with fp32, fp16 and int64 tensors
of a few shapes. Only numpy and cuda.bindings are needed (the engine module is imported alone).

Prints PASS/FAIL per check and exits 1 when one failed; where cuda.bindings or a GPU is missing it prints
"SKIP: no CUDA (...)" and exits 0.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ENGINE_MODULE = "modelsvc.backends.tensorrt._tensorrt_engine"
DTYPES = {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64}
SHAPES = [(1, 1), (4, 8), (64, 512), (3, 5)]  # grows, then reuses


class Recorder:
    """cudart as the engine module sees it: every call passed through to the real one, the interesting ones noted."""

    def __init__(self, cudart: Any) -> None:
        self._cudart = cudart
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._cudart, name)
        if not name.startswith("cuda") or not callable(real) or isinstance(real, type):
            return real

        def call(*args: Any) -> Any:
            note = args[3].name if name == "cudaMemcpyAsync" else None
            self.calls.append((name, note))
            return real(*args)

        return call

    def names(self) -> list[str]:
        return [name if note is None else f"{name}:{note}" for name, note in self.calls]


def standin_tensorrt(cudart: Any, log: list[str]) -> types.ModuleType:
    """A ``tensorrt`` with the name-based tensor API and one engine: OUTPUT0 = INPUT0, OUTPUT1 = INPUT1, of the type
    the plan names (``b"identity:HALF"``)."""
    trt = types.ModuleType("tensorrt")
    severity: Any = enum.Enum("severity", ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"])
    data_type: Any = enum.Enum("data_type", ["FLOAT", "HALF", "INT64"])
    mode: Any = enum.Enum("mode", ["NONE", "INPUT", "OUTPUT"])
    verbosity: Any = enum.Enum("verbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"])
    kept: list[Any] = []  # TensorRT keeps the first logger of the process
    failing: list[str] = []  # execute_async_v3 logs this and returns False

    class ILogger:
        Severity = severity

        def __init__(self) -> None:
            pass

    class IOutputAllocator:
        def __init__(self) -> None:
            pass

    class Context:
        def __init__(self, dtype: Any) -> None:
            self.dtype = dtype
            self.shapes: dict[str, tuple[int, ...]] = {}
            self.addresses: dict[str, int] = {}
            self.nvtx_verbosity = verbosity.DETAILED
            self.streams: list[Any] = []

        def set_optimization_profile_async(self, profile: int, stream: Any) -> bool:
            self.streams.append(stream)
            log.append("set_optimization_profile_async")
            return True

        def set_input_shape(self, name: str, shape: Any) -> bool:
            self.shapes[name] = tuple(int(d) for d in shape)
            return True

        def infer_shapes(self) -> list[str]:
            """As the binding: the names of inputs not yet specified (none here: identity takes any shapes)."""
            return []

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self.shapes.get(name.replace("OUTPUT", "INPUT"), (-1, -1))

        def set_tensor_address(self, name: str, address: int) -> None:
            self.addresses[name] = address

        def execute_async_v3(self, stream: Any) -> bool:
            self.streams.append(stream)
            log.append("execute_async_v3")
            if failing:
                kept[0].log(severity.ERROR, failing[0])
                return False
            kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            for index in (0, 1):
                shape = self.shapes[f"INPUT{index}"]
                nbytes = int(np.prod(shape)) * np.dtype(DTYPES[self.dtype.name]).itemsize
                if nbytes:
                    source, target = self.addresses[f"INPUT{index}"], self.addresses[f"OUTPUT{index}"]
                    try:
                        err, *_ = cudart.cudaMemcpyAsync(target, source, nbytes, kind, stream)
                    except TypeError:  # a cuda-bindings that takes no int for a stream: TensorRT hands one
                        err, *_ = cudart.cudaMemcpyAsync(target, source, nbytes, kind, cudart.cudaStream_t(stream))
                    if err != cudart.cudaError_t.cudaSuccess:
                        raise RuntimeError(f"the stand-in's device to device copy failed: {err}")
            return True

    class Engine:
        num_io_tensors = 4
        num_optimization_profiles = 1

        def __init__(self, dtype: Any) -> None:
            self.names = ["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"]
            self.dtype = dtype
            self.contexts: list[Context] = []

        def get_tensor_name(self, index: int) -> str:
            return self.names[index]

        def get_tensor_mode(self, name: str) -> Any:
            return mode.INPUT if name.startswith("INPUT") else mode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return self.dtype

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return (-1, -1)

        def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
            return [(1, 1), (4, 8), (64, 512)]

        def create_execution_context(self) -> Context:
            self.contexts.append(Context(self.dtype))
            return self.contexts[-1]

    class Runtime:
        def __init__(self, logger: Any) -> None:
            if not kept:
                kept.append(logger)

        def deserialize_cuda_engine(self, plan: bytes) -> Engine | None:
            kind, _, name = plan.decode().partition(":")
            if kind != "identity" or name not in DTYPES:
                kept[0].log(severity.ERROR, f"the stand-in reads identity plans only, not {plan!r}")
                return None
            return Engine(data_type[name])

    for key, value in {
        "__version__": "stand-in",
        "ILogger": ILogger,
        "IOutputAllocator": IOutputAllocator,
        "Runtime": Runtime,
        "TensorIOMode": mode,
        "ProfilingVerbosity": verbosity,
        "failing": failing,
    }.items():
        setattr(trt, key, value)
    return trt


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, name: str, run: Callable[[], str | None]) -> None:
        try:
            detail = run() or ""
        except Exception as exc:
            self.failed += 1
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"PASS  {name}{': ' + detail if detail else ''}", flush=True)


def expect(condition: object, detail: object) -> None:
    """A check's condition (not ``assert``: ``python -O`` must not skip the checks)."""
    if not condition:
        raise AssertionError(detail)


def _memory_type(cudart: Any, pointer: int) -> str:
    err, attributes = cudart.cudaPointerGetAttributes(pointer)
    expect(err == cudart.cudaError_t.cudaSuccess, f"cudaPointerGetAttributes: {err}")
    return str(attributes.type.name)


def _raises(kind: type[Exception], call: Callable[[], object]) -> str:
    try:
        call()
    except kind as exc:
        return str(exc)
    raise AssertionError(f"no {kind.__name__}")


def load_engine_module(*, stubs: bool | None = None) -> tuple[types.ModuleType, str]:
    """``modelsvc.backends.tensorrt._tensorrt_engine`` and how it was imported. modelsvc's package imports need
    tritonclient, msgspec and more, which a GPU image may lack: there (or with ``stubs=True``) the packages
    ``modelsvc``, ``modelsvc.backends`` and ``modelsvc.protocol`` are stood in for by empty packages over the real
    folders, with ``_base`` and ``_devices`` reduced to the names the engine's modules import; the package
    ``modelsvc.backends.tensorrt`` (a docstring), ``_tensorrt_engine``, ``_tensorrt_spec`` and ``_tensorrt_logger``
    are the real files."""
    import importlib

    sys.modules.pop(ENGINE_MODULE, None)
    if not stubs:
        try:
            return importlib.import_module(ENGINE_MODULE), "modelsvc's own imports"
        except ImportError as exc:
            if stubs is False:
                raise
            missing = exc.name
            for name in [n for n in sys.modules if n == "modelsvc" or n.startswith("modelsvc.")]:
                del sys.modules[name]
    else:
        missing = None
    root = Path(__file__).resolve().parents[2] / "modelsvc"
    for name, folder in (("modelsvc", root), ("modelsvc.backends", root / "backends"), ("modelsvc.protocol", None)):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)] if folder else []
        sys.modules[name] = package

    class ModelLoadError(Exception):
        pass

    class ConfigMismatchError(ModelLoadError):
        pass

    class InvalidArgument(Exception):
        pass

    def unused(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("not part of this check")

    base = types.ModuleType("modelsvc.backends._base")
    names = ("complete_dims", "data_type_name", "data_type_value")
    vars(base).update(
        {"ModelLoadError": ModelLoadError, "ConfigMismatchError": ConfigMismatchError, "ModelConfig": Any}
    )
    vars(base).update(dict.fromkeys(names, unused))
    devices = types.ModuleType("modelsvc.backends._devices")
    vars(devices)["Placement"] = Any
    vars(sys.modules["modelsvc.protocol"])["InvalidArgument"] = InvalidArgument
    sys.modules.update({"modelsvc.backends._base": base, "modelsvc.backends._devices": devices})
    how = f"stand-ins for modelsvc's package imports ({missing or 'asked for'} missing)"
    return importlib.import_module(ENGINE_MODULE), how


class Run:
    """The checks against one cudart, with the stand-in TensorRT installed and the engine module imported."""

    def __init__(self, cudart: Any, stubs: bool | None = None) -> None:
        self.cudart = cudart
        self.log: list[str] = []
        self.trt = standin_tensorrt(cudart, self.log)
        sys.modules["tensorrt"] = self.trt  # the stand-in, even where a real TensorRT is installed
        self.module, how = load_engine_module(stubs=stubs)
        print(f"plan_engine_cuda: {ENGINE_MODULE} imported with {how}", flush=True)
        self.recorder = Recorder(cudart)
        vars(self.module)["cudart"] = self.recorder  # the engine's cudart calls go through the recorder to the real one
        self.checks = Checks()
        self.rng = np.random.default_rng(0)

    def all(self) -> int:
        self.checks.check("_check unpacks cudart's (error, value...) tuples", self.tuples)
        for dtype in DTYPES:
            self.engine_checks(dtype)
        self.checks.check("one logger: TensorRT's error text reaches each engine", self.error_text)
        return self.checks.failed

    def tuples(self) -> str:
        check, cudart = self.module._check, self.cudart
        count = check(cudart.cudaGetDeviceCount())
        expect(isinstance(count, int), count)
        expect(count >= 1, count)
        expect(check(cudart.cudaSetDevice(0)) is None, "cudaSetDevice gave a value")
        free, total = check(cudart.cudaMemGetInfo())
        expect(0 < free <= total, (free, total))
        message = _raises(RuntimeError, lambda: check(cudart.cudaMalloc(1 << 62)))
        expect("cudaErrorMemoryAllocation" in message, message)
        return f"{count} device(s), {free >> 20} of {total >> 20} MiB free; an impossible malloc: {message}"

    def feeds(self, dtype: str, shape: tuple[int, ...]) -> dict[str, np.ndarray[Any, Any]]:
        return {f"INPUT{i}": _random(self.rng, DTYPES[dtype], shape) for i in (0, 1)}

    def engine_checks(self, dtype: str) -> None:
        engines: list[Any] = []
        self.checks.check(
            f"{dtype}: open (int(stream), the profile switch synced, NVTX verbosity)", lambda: self.open(dtype, engines)
        )
        if not engines:
            return
        engine = engines[0]
        self.checks.check(
            f"{dtype}: identity through H2D, the stand-in's D2D, D2H", lambda: self.identity(engine, dtype)
        )
        self.checks.check(f"{dtype}: staging buffers pinned, tensors on the device", lambda: self.buffers(engine))
        self.checks.check(
            f"{dtype}: only the output asked for copied back, then the stream synced",
            lambda: self.requested(engine, dtype),
        )
        self.checks.check(f"{dtype}: close frees everything once", lambda: self.close(engine))

    def open(self, dtype: str, engines: list[Any]) -> str:
        self.log.clear()
        self.recorder.calls.clear()
        engine = self.module.PlanEngine(f"identity:{dtype}".encode(), device=0, profile=0)
        engines.append(engine)
        handle, context = engine._stream_handle, engine._context
        expect(isinstance(handle, int), handle)
        expect(handle != 0, "the stream handle is 0, the default stream")
        expect(context.streams == [handle], (context.streams, handle))
        expect(context.nvtx_verbosity.name == "LAYER_NAMES_ONLY", context.nvtx_verbosity)
        names = self.recorder.names()
        expect(names.index("cudaStreamSynchronize") > names.index("cudaStreamCreate"), names)
        return f"stream handle {handle:#x}, the profile switch synchronized"

    def identity(self, engine: Any, dtype: str) -> str:
        mallocs = []
        for shape in SHAPES:
            feeds = self.feeds(dtype, shape)
            out = engine.infer(feeds)
            for i in (0, 1):
                got = out[f"OUTPUT{i}"]
                expect(got.dtype == DTYPES[dtype], got.dtype)
                expect(got.shape == shape, got.shape)
                np.testing.assert_array_equal(got, feeds[f"INPUT{i}"])
            mallocs.append(sum(name in ("cudaMalloc", "cudaMallocHost") for name, _ in self.recorder.calls))
        expect(mallocs[-1] == mallocs[-2], f"a buffer grew for a smaller batch after the largest: {mallocs}")
        return f"shapes {SHAPES}; buffers allocated after each: {mallocs}"

    def buffers(self, engine: Any) -> str:
        kinds = {name: _memory_type(self.cudart, buffer.ptr) for name, buffer in engine._host.items()}
        kinds.update({f"{name} (device)": _memory_type(self.cudart, b.ptr) for name, b in engine._gpu.items()})
        expect(all(v.endswith("Host") for k, v in kinds.items() if "(device)" not in k), kinds)
        expect(all(v.endswith("Device") for k, v in kinds.items() if "(device)" in k), kinds)
        return ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))

    def requested(self, engine: Any, dtype: str) -> str:
        feeds = self.feeds(dtype, (8, 128))
        self.recorder.calls.clear()
        self.log.clear()
        out = engine.infer(feeds, ["OUTPUT1"])
        expect(list(out) == ["OUTPUT1"], list(out))
        np.testing.assert_array_equal(out["OUTPUT1"], feeds["INPUT1"])
        names = self.recorder.names()
        d2h = [i for i, n in enumerate(names) if n.endswith("DeviceToHost")]
        h2d = [i for i, n in enumerate(names) if n.endswith("HostToDevice")]
        expect(len(d2h) == 1, names)
        expect(len(h2d) == 2, names)
        expect(max(h2d) < d2h[0], names)
        expect(names[-1] == "cudaStreamSynchronize", names)
        expect(self.log == ["execute_async_v3"], self.log)
        return " -> ".join(n.removeprefix("cuda") for n in names if n != "cudaSetDevice")

    def close(self, engine: Any) -> str:
        held = len(engine._host) + len(engine._gpu)
        self.recorder.calls.clear()
        engine.close()
        engine.close()
        frees = sum(name in ("cudaFree", "cudaFreeHost") for name, _ in self.recorder.calls)
        expect(frees == held, (frees, held))
        expect([n for n, _ in self.recorder.calls].count("cudaStreamDestroy") == 1, self.recorder.calls)
        return f"{frees} buffers freed, the stream destroyed, once"

    def error_text(self) -> str:
        first = self.module.PlanEngine(b"identity:FLOAT")
        try:
            message = _raises(self.module.ModelLoadError, lambda: self.module.PlanEngine(b"not a plan"))
            expect("identity plans only" in message, message)
            self.trt.failing.append("enqueueV3: an error TensorRT logged")
            feeds = {f"INPUT{i}": np.ones((2, 2), np.float32) for i in (0, 1)}
            message = _raises(RuntimeError, lambda: first.infer(feeds))
            expect("an error TensorRT logged" in message, message)
        finally:
            self.trt.failing.clear()
            first.close()
        return "a second engine's load error and a failed run both carry TensorRT's text"


def run(cudart: Any, stubs: bool | None = None) -> int:
    """Every check against ``cudart``; the number that failed."""
    return Run(cudart, stubs).all()


def _random(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    if np.dtype(dtype).kind == "i":
        return rng.integers(-(2**40), 2**40, size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def main() -> int:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        print(f"SKIP: no CUDA (cuda.bindings does not import: {exc})")
        return 0
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count < 1:
        print(f"SKIP: no CUDA (cudaGetDeviceCount: {getattr(err, 'name', err)}, {count} device(s))")
        return 0
    failed = run(cudart)
    print(f"plan_engine_cuda: {'every check passed' if not failed else f'{failed} check(s) FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
