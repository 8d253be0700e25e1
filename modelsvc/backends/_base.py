"""What a backend gives the scheduler: instances that execute one batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
from tritonclient.grpc import model_config_pb2

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
