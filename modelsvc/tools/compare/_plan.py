"""``PlanRunner``: a TensorRT plan run through the tensorrt backend's engine wrapper.

The wrapper (``modelsvc.backends._tensorrt_engine.PlanEngine``) owns everything that touches TensorRT and CUDA;
this module only adapts it to the ``Runner`` protocol, and imports it when a plan is opened, so that comparing
ONNX files and served models needs neither TensorRT nor a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from ...protocol import CONFIG_TO_WIRE
from ._errors import RunnerFailed, SourceError
from ._types import Array, TensorDecl

__all__ = ["PlanRunner"]

ENGINE_MODULE = "modelsvc.backends._tensorrt_engine"
INSTALL_HINT = "pip install 'modelsvc[tensorrt]'"
#: top-level modules whose absence means the tensorrt extra is not installed
_EXTRA_MODULES = ("tensorrt", "cuda")


class _EngineTensor(Protocol):
    name: str
    is_input: bool
    datatype: str  # the model configuration's name: TYPE_FP32
    dims: Sequence[int]


class _EngineDescription(Protocol):
    tensors: Sequence[_EngineTensor]


class _PlanEngine(Protocol):
    description: _EngineDescription

    def infer(self, feeds: Mapping[str, Array]) -> Mapping[str, Array]: ...

    def close(self) -> None: ...


def _missing_extra(exc: ImportError) -> bool:
    name = exc.name or ""
    return name.split(".")[0] in _EXTRA_MODULES


class PlanRunner:
    """A TensorRT plan (a file's path, or the plan's bytes) on GPU ``device`` with optimization ``profile``."""

    def __init__(self, path_or_bytes: str | Path | bytes, device: int = 0, profile: int = 0) -> None:
        if isinstance(path_or_bytes, bytes):
            self.source = f"<plan of {len(path_or_bytes)} bytes>"
            plan = path_or_bytes
        else:
            self.source = str(path_or_bytes)
            try:
                plan = Path(path_or_bytes).read_bytes()
            except FileNotFoundError:
                raise SourceError(f"{self.source}: no such file") from None
            except OSError as exc:
                raise SourceError(f"{self.source}: cannot read it: {exc}") from None
        try:
            module = importlib.import_module(ENGINE_MODULE)
            self._engine: _PlanEngine = module.PlanEngine(plan, device=device, profile=profile)
        except ImportError as exc:
            if _missing_extra(exc):
                raise SourceError(f"{self.source}: running a TensorRT plan needs TensorRT: {INSTALL_HINT}") from None
            raise
        tensors = list(self._engine.description.tensors)
        self.inputs: list[TensorDecl] = [
            TensorDecl(t.name, _wire(self.source, t.name, t.datatype), tuple(t.dims)) for t in tensors if t.is_input
        ]
        self.outputs: list[str] = [t.name for t in tensors if not t.is_input]

    def run(self, feeds: Mapping[str, Array]) -> dict[str, Array]:
        try:
            outputs = self._engine.infer(feeds)
        except Exception as exc:  # the engine's own errors (shape outside the profile, CUDA failures)
            raise RunnerFailed(f"{self.source}: TensorRT failed: {exc}") from None
        return {name: np.asarray(value) for name, value in outputs.items()}

    def close(self) -> None:
        self._engine.close()


def _wire(source: str, name: str, config_datatype: str) -> str:
    wire = CONFIG_TO_WIRE.get(config_datatype)
    if wire is None:
        raise SourceError(f"{source}: tensor {name!r} has datatype {config_datatype}, which compare cannot feed")
    return wire
