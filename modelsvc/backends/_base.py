"""What a backend gives the scheduler: instances that execute one batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
from tritonclient.grpc import model_config_pb2

from modelsvc.protocol import InferRequest

#: the generated protobuf class (tritonclient ships no type stubs, so mypy sees Any)
ModelConfig: TypeAlias = model_config_pb2.ModelConfig
Arrays = dict[str, np.ndarray[Any, Any]]


class ModelLoadError(Exception):
    """A model version could not be loaded; the message says why (shown in the repository index)."""


class ConfigMismatchError(ModelLoadError):
    """The model configuration disagrees with the model artifact (raised by ``Backend.autocomplete``).

    ``tensor`` names the input or output concerned and ``field`` the config field, where known, so
    that the repository can point at the offending line of ``config.pbtxt``.
    """

    def __init__(self, message: str, *, tensor: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.field = field


class ModelInstance(Protocol):
    """One execution context of a model version (one per instance_group entry x count x gpu).

    ``execute`` is called from a worker thread, never concurrently for the same instance, with
    inputs whose first dimension is the batch when the model batches. BYTES tensors are numpy
    object arrays of ``bytes`` both ways.
    """

    name: str
    #: "cpu" or "gpu:<id>"
    device: str
    #: the execution providers (or engine) actually in use, e.g. ["CPUExecutionProvider"]
    providers: list[str]

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One request of a batch, as an instance that takes requests one by one sees it."""

    #: the request's tensors (with its own batch dimension when the model batches)
    inputs: Arrays
    #: the outputs this request wants (every model output when the client named none)
    outputs: tuple[str, ...]
    #: the request as the data plane received it (id, parameters), None when the scheduler was called directly
    request: InferRequest | None = None


@runtime_checkable
class RequestsInstance(Protocol):
    """An instance that wants the requests of a batch as a list rather than concatenated (python models).

    When an instance has ``execute_requests`` the scheduler calls it instead of ``execute``: it forms
    batches as usual but hands over each request's own tensors, and gets back one entry per request,
    in order: the request's outputs, or the exception that fails that request alone. An exception
    raised by ``execute_requests`` itself fails every request of the batch.
    """

    def execute_requests(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]: ...


class Backend(Protocol):
    name: str

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Fill what ``config`` leaves out (inputs, outputs, data types, dims, batching).

        Raise ConfigMismatchError where the config contradicts the artifact, ModelLoadError where the
        artifact cannot be read.
        """
        ...

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """Create every instance that ``config.instance_group`` asks for; raise ModelLoadError on failure."""
        ...


def data_type_name(value: int) -> str:
    """A model config DataType's name (``TYPE_FP32``)."""
    return str(model_config_pb2.DataType.Name(value))


def data_type_value(name: str) -> int:
    """A model config DataType's number from its name."""
    return int(model_config_pb2.DataType.Value(name))


def complete_dims(
    entry: Any, artifact_dims: Sequence[int], kind: str, name: str, model: str, max_batch_size: int, shown: str
) -> list[int] | None:
    """Fill a config input/output's dims from the artifact's (its batch dimension dropped when the model batches;
    a scalar per batch item becomes Triton's dims [1] reshaped to []), or check the dims the config gives against
    them (-1 matches anything) and return those. ``shown`` is the artifact's shape as the error shows it, e.g.
    ``model's shape [-1, 16]``. ConfigMismatchError names the model and the tensor."""
    dims = list(artifact_dims[1:] if max_batch_size > 0 else artifact_dims)
    if not entry.dims and not entry.HasField("reshape"):
        if dims:
            entry.dims.extend(dims)
        else:
            entry.dims.append(1)
            entry.reshape.SetInParent()
        return None
    given = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    if len(given) != len(dims) or any(g != d and g != -1 and d != -1 for g, d in zip(given, dims, strict=True)):
        full = "[-1] + " if max_batch_size > 0 else ""
        raise ConfigMismatchError(
            f"{kind} '{name}' of model '{model}': configuration dims {full}{given} do not match the {shown}",
            tensor=name,
            field="dims",
        )
    return given
