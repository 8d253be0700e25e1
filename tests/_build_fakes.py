"""Stand-ins for ``modelsvc build``'s tests: a plan that is an ONNX model (run by ONNX Runtime), and a fake
``tensorrt`` module shaped like TensorRT 10's or 11's builder API.

The fake's builder "builds" the file its parser was given: the plan's bytes are that ONNX model, so the build's
check (plan vs ONNX Runtime on the original model) runs the model TensorRT would have parsed, the converted one
included. It records what the build asked for (network creation flags, builder flags set and cleared, the
calibrator) and offers only the API of its major version: 11 has no FP16/BF16/INT8 ``BuilderFlag``, no
``IInt8EntropyCalibrator2``, no ``int8_calibrator`` nor ``set_calibration_profile`` on its builder config.
Its logger classes are the runtime stand-in's (``tests._trt_standin``).
"""

from __future__ import annotations

import enum
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from modelsvc.tools.compare import OnnxRunner
from tests._trt_standin import ILogger, Severity

VERSIONS = {10: "10.16.1.11", 11: "11.4.0.106"}


class OnnxAsPlan(OnnxRunner):
    """Stands in for PlanRunner: the 'plan' bytes are an ONNX model, run by ONNX Runtime."""

    opened: ClassVar[list[int]] = []
    folder: ClassVar[str] = ""

    def __init__(self, plan: bytes, profile: int = 0) -> None:
        path = Path(OnnxAsPlan.folder) / f"stand-in-{len(self.opened)}.onnx"
        path.write_bytes(plan)
        OnnxAsPlan.opened.append(profile)
        super().__init__(path)


@dataclass
class BuildRecord:
    """What the fake TensorRT's builder was asked for."""

    network_flags: list[int] = field(default_factory=list)
    #: the files the parser read, and each one's bytes (a temporary file is gone after the build)
    parsed: list[Path] = field(default_factory=list)
    parsed_bytes: list[bytes] = field(default_factory=list)
    flags_set: list[str] = field(default_factory=list)
    flags_cleared: list[str] = field(default_factory=list)
    calibrator: Any = None
    calibration_profile: bool = False
    calibration_cache_read: bytes | None = None


def fake_tensorrt(major: int, record: BuildRecord) -> types.ModuleType:
    """A ``tensorrt`` module with the builder API of TensorRT ``major`` (10 or 11)."""
    trt = types.ModuleType("tensorrt")
    ten = major == 10
    flags = ["TF32", "REFIT", *(["FP16", "BF16", "INT8"] if ten else [])]
    creation = {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1} if ten else {"STRONGLY_TYPED": 0}
    builder_flag: Any = enum.Enum("BuilderFlag", flags)
    data_type: Any = enum.Enum("DataType", ["FLOAT", "HALF", "INT64"])

    class Network:
        num_inputs = 0

        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.source = b""

    class Parser:
        num_errors = 0

        def __init__(self, network: Network, logger: Any) -> None:
            self.network = network

        def parse_from_file(self, path: str) -> bool:
            record.parsed.append(Path(path))
            self.network.source = Path(path).read_bytes()
            record.parsed_bytes.append(self.network.source)
            return True

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[Any, ...]] = {}

        def set_shape(self, name: str, low: Any, opt: Any, high: Any) -> None:
            self.shapes[name] = (low, opt, high)

    class Cache:
        def serialize(self) -> bytes:
            return b"fake-timing-cache"

    class Config:
        # pybind11 objects refuse unknown attributes: 11's config has no int8_calibrator to assign
        __slots__ = ("__weakref__", "builder_optimization_level", "cache", "pool", "profiles", "profiling_verbosity")
        __slots__ += ("int8_calibrator",) if ten else ()

        def __init__(self) -> None:
            self.profiles: list[Profile] = []
            self.cache: Cache | None = None

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def set_flag(self, flag: Any) -> None:
            record.flags_set.append(flag.name)

        def clear_flag(self, flag: Any) -> None:
            record.flags_cleared.append(flag.name)

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            self.pool = size

        def create_timing_cache(self, data: bytes) -> Cache:
            return Cache()

        def set_timing_cache(self, cache: Cache, ignore_mismatch: bool) -> bool:
            self.cache = cache
            return True

        def get_timing_cache(self) -> Cache | None:
            return self.cache

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> Network:
            record.network_flags.append(flags)
            return Network(flags)

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            calibrator = getattr(config, "int8_calibrator", None)
            if calibrator is not None:
                record.calibrator = calibrator
                record.calibration_cache_read = calibrator.read_calibration_cache()
            return network.source

    class Inspector:
        def get_engine_information(self, fmt: Any) -> str:
            layer = {"Name": "fake", "LayerType": "Myelin", "Outputs": [{"DataType": "Half"}]}
            return json.dumps({"Layers": [layer]})

    class Engine:
        def create_engine_inspector(self) -> Inspector:
            return Inspector()

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, plan: bytes) -> Engine:
            return Engine()

    members: dict[str, Any] = {
        "__version__": VERSIONS[major],
        "Builder": Builder,
        "OnnxParser": Parser,
        "Runtime": Runtime,
        "ILogger": ILogger,
        "Severity": Severity,
        "BuilderFlag": builder_flag,
        "DataType": data_type,
        "NetworkDefinitionCreationFlag": enum.IntEnum("NetworkDefinitionCreationFlag", creation),
        "MemoryPoolType": enum.Enum("MemoryPoolType", ["WORKSPACE"]),
        "ProfilingVerbosity": enum.Enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "DETAILED"]),
        "LayerInformationFormat": enum.Enum("LayerInformationFormat", ["ONELINE", "JSON"]),
        "nptype": lambda dtype: {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64}[dtype.name],
    }
    if ten:

        class IInt8EntropyCalibrator2:
            def __init__(self) -> None:
                pass

        def set_calibration_profile(config: Config, profile: Profile) -> None:
            record.calibration_profile = True

        members["IInt8EntropyCalibrator2"] = IInt8EntropyCalibrator2
        Config.set_calibration_profile = set_calibration_profile
    for name, value in members.items():
        setattr(trt, name, value)
    return trt
