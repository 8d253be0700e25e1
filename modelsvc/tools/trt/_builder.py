"""TensorRT's builder: an ONNX file and its profiles to a serialized plan. The only module of ``modelsvc build``
that imports TensorRT or CUDA, and it has never run on the machines this project is developed on (no GPU);
``tests/tools/test_build.py``'s ``gpu`` tests and ``loadtests/gpu/verify.sh`` run it where there is one.

Written against TensorRT's Python API, 10.x and 11.x: ``Builder``, ``create_network()`` (explicit batch is
the only mode), ``OnnxParser.parse_from_file``, ``create_optimization_profile`` + ``set_shape``,
``IBuilderConfig`` (memory pool limit, builder optimization level, timing cache, DETAILED profiling for the
inspector), ``build_serialized_network``, then ``create_engine_inspector`` on the deserialized engine.

Networks are strongly typed (every tensor has the ONNX model's type; precision comes from converting the model
first, ``_precision``) and no precision flag is set: on TensorRT 11, where strong typing is the only mode,
``create_network()``; on 10 ``create_network(1 << STRONGLY_TYPED)``. TF32 is cleared unless asked for, so fp32
layers stay fp32. The one weakly typed build left is TensorRT 10's INT8 calibration of a model without Q/DQ
(``BuilderSettings.calibrate``: INT8 and FP16 flags and an entropy calibrator); TensorRT 11 removed it, and
asking for it there is a usage error that says so. Nothing here writes a file: the caches it loads are read,
and the ones it produces come back as bytes, written by the caller once the plan has passed its check.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...backends.tensorrt import _tensorrt_logger as tensorrt_logger
from ._errors import TENSORRT_EXTRA, BuildError, BuildUsageError
from ._shapes import Profile, Shape, format_shape

__all__ = ["BuilderSettings", "BuiltPlan", "build_serialized", "can_calibrate", "import_tensorrt"]

_MIB = 1 << 20
#: the flags of TensorRT 10's weakly typed INT8 calibration (int8 kernels, fp16 where int8 has none)
_CALIBRATION_FLAGS = ("INT8", "FP16")


@dataclass(frozen=True)
class BuilderSettings:
    """What the builder is asked for, beyond the network and its profiles."""

    #: what was asked for (fp32, fp16, bf16 or int8), for the log: the network's types come from the model
    precision: str = "fp32"
    #: TensorRT 10's INT8 calibration of a model without Q/DQ: a weakly typed network with the INT8 and FP16
    #: flags (as trtexec's --int8 --fp16) and the calibrator; every other build is strongly typed with no flag
    calibrate: bool = False
    #: allow TF32 math for fp32 layers (TensorRT's default; off unless asked so that fp32 stays fp32)
    tf32: bool = False
    #: the workspace memory pool limit in MiB (None: TensorRT's default, the device's memory)
    workspace_mib: int | None = None
    #: builder optimization level 0..5 (None: TensorRT's default, 3)
    optimization_level: int | None = None
    #: serialized timing cache to start from (empty: a new one)
    timing_cache: bytes = b""
    #: int8: a calibration cache to use instead of calibrating
    calibration_cache: bytes = b""
    #: int8: batches of real inputs to calibrate on (each a feed dict of one shape)
    calibration_batches: Sequence[Mapping[str, np.ndarray[Any, Any]]] = ()


@dataclass
class BuiltPlan:
    """What the builder produced."""

    plan: bytes
    seconds: float
    tensorrt_version: str
    #: the engine inspector's JSON ("" where it could not be read)
    inspector_json: str
    #: the timing cache after the build, to be saved (empty when none could be serialized)
    timing_cache: bytes = b""
    #: whether a given timing cache was accepted
    timing_cache_loaded: bool = False
    #: int8: the calibration cache TensorRT wrote (empty when it used the one given)
    calibration_cache: bytes = b""
    warnings: list[str] = field(default_factory=list)


def import_tensorrt() -> Any:
    """``tensorrt``, or a BuildUsageError naming the extra to install."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError:
        raise BuildUsageError(
            f"building a plan needs TensorRT, which is not installed: {TENSORRT_EXTRA} "
            "(TensorRT's wheels come from NVIDIA's package index; a plan is built on the GPU it will run on)"
        ) from None


def can_calibrate(trt: Any) -> bool:
    """Whether this TensorRT still has the INT8 calibrator and the weakly typed INT8 flag (10.x; not 11)."""
    return hasattr(trt, "IInt8EntropyCalibrator2") and hasattr(trt.BuilderFlag, "INT8")


def _import_cudart() -> Any:
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise BuildUsageError(
        f"--int8 calibration copies inputs to the GPU with cuda-python, not installed: {TENSORRT_EXTRA}"
    )


def _cuda_check(cudart: Any, result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise BuildError(f"CUDA call failed during calibration: {err}")
    return rest[0] if len(rest) == 1 else rest


def _logger(trt: Any, errors: list[str], warnings: list[str]) -> Any:
    """The process's one TensorRT logger (TensorRT keeps a single one: ``modelsvc.backends.tensorrt._tensorrt_logger``),
    collecting what TensorRT logs during this ``build_serialized`` call into ``errors`` and ``warnings``."""
    return tensorrt_logger.collect(trt, errors, warnings)


def _create_network(trt: Any, builder: Any, strongly_typed: bool) -> Any:
    if not strongly_typed or not hasattr(trt.BuilderFlag, "FP16"):
        # weakly typed (10's calibration), or a TensorRT without weak typing (11: STRONGLY_TYPED is deprecated
        # there and ignored, strong typing being the only mode)
        return builder.create_network()
    return builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))


def _parse(trt: Any, builder: Any, logger: Any, onnx_path: Path, strongly_typed: bool) -> tuple[Any, Any]:
    network = _create_network(trt, builder, strongly_typed)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        problems = []
        for index in range(parser.num_errors):
            error = parser.get_error(index)
            node_name = error.node_name() if hasattr(error, "node_name") else ""
            operator = error.node_operator() if hasattr(error, "node_operator") else ""
            where = f"node {node_name!r} ({operator})" if node_name else f"node #{error.node()}"
            problems.append(f"{where}: {error.desc()}")
        detail = "; ".join(problems) or "no detail given"
        raise BuildError(f"TensorRT's ONNX parser cannot read {onnx_path}: {detail}")
    return network, parser


def _set_flags(trt: Any, config: Any, settings: BuilderSettings) -> None:
    """TF32 off unless asked (strongly typed builds); TensorRT 10's calibration flags for a calibrated build."""
    if settings.calibrate:
        for flag_name in _CALIBRATION_FLAGS:
            flag = getattr(trt.BuilderFlag, flag_name, None)
            if flag is None:
                raise BuildUsageError(
                    f"--int8 calibration: TensorRT {trt.__version__} has no {flag_name} builder flag (TensorRT 11 "
                    "builds strongly typed networks only): quantize the ONNX model to Q/DQ first and build it "
                    "with --int8 alone, or calibrate with TensorRT 10"
                )
            config.set_flag(flag)
        return
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if tf32 is not None and not settings.tf32:
        config.clear_flag(tf32)


def _calibrator(trt: Any, settings: BuilderSettings, written: list[bytes]) -> Any:
    """An IInt8EntropyCalibrator2 over ``settings.calibration_batches`` (or only the cache given)."""
    base: Any = getattr(trt, "IInt8EntropyCalibrator2", None)
    if base is None:
        raise BuildUsageError(
            f"--int8: TensorRT {trt.__version__} has no INT8 calibrator (removed in TensorRT 11): quantize the "
            "ONNX model to Q/DQ first and build it with --int8 alone, or calibrate with TensorRT 10"
        )
    batches = list(settings.calibration_batches)
    cudart: Any = _import_cudart() if batches else None
    batch_size = int(next(iter(batches[0].values())).shape[0]) if batches and batches[0] else 1

    class _Calibrator(base):  # type: ignore[misc]
        def __init__(self) -> None:
            base.__init__(self)
            self._next = 0
            self._device: dict[str, tuple[int, int]] = {}  # name -> (pointer, bytes)

        def get_batch_size(self) -> int:
            return batch_size

        def get_batch(self, names: list[str], *_: Any) -> list[int] | None:
            if self._next >= len(batches):
                return None
            batch = batches[self._next]
            self._next += 1
            pointers = []
            for name in names:
                array = np.ascontiguousarray(batch[name])
                pointer, size = self._device.get(name, (0, 0))
                if size < array.nbytes:
                    if pointer:
                        _cuda_check(cudart, cudart.cudaFree(pointer))
                    pointer = int(_cuda_check(cudart, cudart.cudaMalloc(array.nbytes)))
                    self._device[name] = (pointer, array.nbytes)
                kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
                _cuda_check(cudart, cudart.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, kind))
                pointers.append(pointer)
            return pointers

        def read_calibration_cache(self, *_: Any) -> bytes | None:
            return settings.calibration_cache or None

        def write_calibration_cache(self, cache: Any, *_: Any) -> None:
            written.append(memoryview(cache).tobytes())

        def free(self) -> None:
            for pointer, _size in self._device.values():
                cudart.cudaFree(pointer)
            self._device.clear()

    return _Calibrator()


def _calibration_in_network_types(
    trt: Any, network: Any, batches: Sequence[Mapping[str, np.ndarray[Any, Any]]]
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """The calibration batches as contiguous arrays of each network input's datatype: TensorRT reads the device
    buffers get_batch hands it as that type, so an int32 array for an INT64 input would be read past its end.
    Only the width may differ (int32 for INT64, float64 for FLOAT); another kind is a BuildUsageError."""
    wanted: dict[str, np.dtype[Any]] = {}
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        try:
            wanted[tensor.name] = np.dtype(trt.nptype(tensor.dtype))
        except TypeError:  # no numpy type (BF16, FP8, INT4): the array is taken as it is
            continue
    cast = []
    for batch in batches:
        arrays = {}
        for name, array in batch.items():
            want = wanted.get(name)
            have = np.asarray(array).dtype
            if want is not None and have != want:
                ints = "iu"
                if not (have.kind == want.kind or (have.kind in ints and want.kind in ints)):
                    raise BuildUsageError(
                        f"--int8 calibration: input '{name}' is {have} in the calibration data, the network's is {want}"
                    )
            arrays[name] = np.ascontiguousarray(array, dtype=want)
        cast.append(arrays)
    return cast


def _calibration_profile(builder: Any, settings: BuilderSettings, profiles: Sequence[Profile]) -> Any:
    profile = builder.create_optimization_profile()
    if settings.calibration_batches:
        first = settings.calibration_batches[0]
        for name, array in first.items():
            shape: Shape = tuple(int(d) for d in array.shape)
            profile.set_shape(name, shape, shape, shape)
    else:
        for name, ranges in profiles[0].items():
            profile.set_shape(name, ranges.opt, ranges.opt, ranges.opt)
    return profile


@tensorrt_logger.scoped
def build_serialized(
    onnx_path: Path, profiles: Sequence[Profile], settings: BuilderSettings, log: Callable[[str], None]
) -> BuiltPlan:
    """Parse ``onnx_path``, add ``profiles``, build; BuildError with TensorRT's own errors when it fails."""
    trt = import_tensorrt()
    errors: list[str] = []
    warnings: list[str] = []
    logger = _logger(trt, errors, warnings)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path, strongly_typed=not settings.calibrate)
    config = builder.create_builder_config()
    for index, profile in enumerate(profiles):
        optimization_profile = builder.create_optimization_profile()
        for name, ranges in profile.items():
            optimization_profile.set_shape(name, ranges.min, ranges.opt, ranges.max)
        if config.add_optimization_profile(optimization_profile) < 0:
            shapes = ", ".join(f"{n}:{format_shape(r.min)}..{format_shape(r.max)}" for n, r in profile.items())
            raise BuildError(f"TensorRT refused profile {index} ({shapes}): {'; '.join(errors[-3:])}")
    _set_flags(trt, config, settings)
    if settings.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib * _MIB)
    if settings.optimization_level is not None:
        config.builder_optimization_level = settings.optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED

    # a timing cache is always attached (an empty one when none is given or the given one is refused): without
    # one, get_timing_cache() returns None after the build and there is nothing to save for the next build
    cache = config.create_timing_cache(settings.timing_cache) if settings.timing_cache else None
    loaded = cache is not None and bool(config.set_timing_cache(cache, False))
    if not loaded:
        if settings.timing_cache:
            log("the timing cache was made by another TensorRT or GPU; starting a new one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)

    calibration_written: list[bytes] = []
    calibrator = None
    if settings.calibrate:
        if settings.calibration_batches:
            batches = _calibration_in_network_types(trt, network, settings.calibration_batches)
            settings = dataclasses.replace(settings, calibration_batches=batches)
        calibrator = _calibrator(trt, settings, calibration_written)
        config.int8_calibrator = calibrator
        config.set_calibration_profile(_calibration_profile(builder, settings, profiles))

    typing = "weakly typed, INT8 calibration" if settings.calibrate else "strongly typed"
    log(f"building with TensorRT {trt.__version__} ({settings.precision}, {typing}, {len(profiles)} profile(s))")
    started = time.monotonic()
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None and settings.calibration_batches:
            calibrator.free()
    seconds = time.monotonic() - started
    if serialized is None:
        detail = "; ".join(errors[-5:]) or "TensorRT logged no error"
        raise BuildError(f"TensorRT could not build {onnx_path}: {detail}")
    plan = memoryview(serialized).tobytes()

    timing = config.get_timing_cache()
    timing_bytes = memoryview(timing.serialize()).tobytes() if timing is not None else b""
    return BuiltPlan(
        plan=plan,
        seconds=seconds,
        tensorrt_version=str(trt.__version__),
        inspector_json=_inspect(trt, logger, plan),
        timing_cache=timing_bytes,
        timing_cache_loaded=loaded,
        calibration_cache=calibration_written[-1] if calibration_written else b"",
        warnings=warnings,
    )


def _inspect(trt: Any, logger: Any, plan: bytes) -> str:
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        return ""
    inspector = engine.create_engine_inspector()
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
