"""Transport-neutral inference messages: what both HTTP and gRPC decode into and encode from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Parameters = dict[str, Any]


@dataclass(slots=True)
class Tensor:
    """A named tensor with its v2 datatype; ``data`` already has ``shape``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; ``binary`` is None when the client did not say."""

    name: str
    binary: bool | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    inputs: list[Tensor]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)

    @property
    def binary_data_output(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
