"""``InferParameter`` maps of the v2 gRPC messages to and from plain Python values (no I/O).

An ``InferParameter`` is a oneof of bool, int64, double and string; the server and the client read and fill
them the same way, here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["parameters_from_proto", "set_proto_parameter"]


def parameters_from_proto(params: Any) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values (whichever of bool, int, string, double is set)."""
    out: dict[str, Any] = {}
    for name, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is not None:
            out[str(name)] = getattr(param, kind)
    return out


def set_proto_parameter(target: Any, name: str, value: Any) -> None:
    """Fill ``target[name]`` from a bool, int, float or str (numpy scalars too); TypeError for anything else."""
    if isinstance(value, bool | np.bool_):
        target[name].bool_param = bool(value)
    elif isinstance(value, int | np.integer):
        target[name].int64_param = int(value)
    elif isinstance(value, float | np.floating):
        target[name].double_param = float(value)
    elif isinstance(value, str):
        target[name].string_param = value
    else:
        raise TypeError(f"parameter '{name}' must be a bool, int, float or str, got {type(value).__name__}")
