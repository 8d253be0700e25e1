"""A model version's tensor contract: :class:`TensorSpec`, one input or output as its config.pbtxt declares it.

The plain type that the data plane, ensembles, warmup and the version lifecycle all read; it depends on
nothing of the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2

from ..protocol import CONFIG_TO_WIRE


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    """Without the batch dimension."""
    reshape: tuple[int, ...] | None = None
    optional: bool = False


def tensor_specs(entries: Any) -> dict[str, TensorSpec]:
    """The specs of a config's ``input`` or ``output`` entries, by name."""
    specs = {}
    for e in entries:
        dtype_name = model_config_pb2.DataType.Name(e.data_type)
        reshape = tuple(e.reshape.shape) if e.HasField("reshape") else None
        specs[e.name] = TensorSpec(
            e.name,
            CONFIG_TO_WIRE.get(dtype_name, dtype_name),
            tuple(e.dims),
            reshape,
            getattr(e, "optional", False),
        )
    return specs
