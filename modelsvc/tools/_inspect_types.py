"""The types of ``modelsvc inspect``'s answers (``inspect_model`` re-exports them): a model file's tensors and
what the file says of itself, and the error for a file that cannot be inspected."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["InspectError", "ModelInfo", "TensorInfo"]


class InspectError(Exception):
    """The file cannot be inspected: it is missing, it is not a model, or a package it needs is absent."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output of a model."""

    name: str
    #: the model configuration's datatype name (``TYPE_FP32``); for a type Triton has no name for,
    #: the file's own name for it (``tensor(float8e4m3fn)``, ``sequence``)
    datatype: str
    #: one entry per dimension; ``-1`` where the size is not fixed
    dims: tuple[int, ...]
    #: the symbolic name of each dimension where the file gives one (``batch``), else None
    dim_names: tuple[str | None, ...] = ()

    def names(self) -> tuple[str | None, ...]:
        """``dim_names`` padded to the rank."""
        return tuple(self.dim_names) + (None,) * (len(self.dims) - len(self.dim_names))


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ``inspect_model`` found in a model file."""

    path: Path
    #: ``onnx``, ``tensorrt``, ``torchscript`` or ``openvino``
    format: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    #: operator set version per domain (``ai.onnx`` for ONNX's default domain); empty for TensorRT
    opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int | None = None
    #: producer name and version as the file records them (``pytorch 2.13.0``)
    producer: str | None = None
    graph_name: str | None = None
    #: elements and bytes held in the graph's initializers (weights and constants)
    parameter_count: int = 0
    parameter_bytes: int = 0
    #: files next to the model that hold some of its tensors (ONNX external data)
    external_data: tuple[str, ...] = ()
    #: TensorRT optimization profiles: per profile, per input, the (min, opt, max) shapes
    profiles: tuple[dict[str, tuple[tuple[int, ...], ...]], ...] = ()
    #: file size in bytes (with OpenVINO's .bin)
    file_bytes: int = 0
    #: what the file does not say, or says outside its tensors (TorchScript's schema, OpenVINO's weight types)
    notes: tuple[str, ...] = ()
