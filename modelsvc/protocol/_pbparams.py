"""What the server and the client read from and fill into the v2 gRPC messages alike (no I/O).

``InferParameter`` maps to and from plain Python values (an ``InferParameter`` is a oneof of bool, int64,
double and string), and the typed ``InferTensorContents`` field that carries each datatype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CONTENTS_FIELDS", "parameters_from_proto", "set_proto_parameter"]

#: the typed ``InferTensorContents`` field of each datatype (FP16 and BF16 have none: they travel raw only)
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


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
