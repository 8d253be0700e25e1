"""The v2 datatypes, their numpy dtypes and the names model configs use for them."""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ._errors import InvalidArgument

try:  # BF16 has no numpy dtype of its own; ml_dtypes provides one where installed.
    import ml_dtypes

    _BF16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

#: v2 datatype name -> numpy dtype (BYTES is an object array of ``bytes``)
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
if _BF16 is not None:
    NUMPY_DTYPES["BF16"] = _BF16

#: every datatype the protocol names, whether or not numpy can hold it here
ALL_DATATYPES = (*NUMPY_DTYPES.keys(), "BF16")

_BY_NUMPY: dict[np.dtype[Any], str] = {dt: name for name, dt in NUMPY_DTYPES.items()}

#: ``TYPE_FP32`` (model config, ``DataType`` enum name) -> ``FP32`` (wire)
CONFIG_TO_WIRE: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
WIRE_TO_CONFIG: dict[str, str] = {v: k for k, v in CONFIG_TO_WIRE.items()}

#: an ONNX tensor type as ONNX Runtime spells it (``tensor(`` + the lower-case ``TensorProto.DataType``
#: name + ``)``) -> model config DataType name
ONNX_TO_CONFIG: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bfloat16)": "TYPE_BF16",
}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype for a v2 datatype, or InvalidArgument naming the datatype."""
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        if datatype == "BF16":
            raise InvalidArgument("datatype BF16 needs the ml_dtypes package on the server") from None
        raise InvalidArgument(f"unknown datatype '{datatype}', expected one of {', '.join(ALL_DATATYPES)}") from None


def wire_datatype(dtype: np.dtype[Any]) -> str:
    """The v2 datatype for a numpy dtype (str and bytes arrays are BYTES)."""
    found = _BY_NUMPY.get(dtype)
    if found is not None:
        return found
    if dtype.kind in ("S", "U", "O"):
        return "BYTES"
    raise InvalidArgument(f"numpy dtype {dtype} has no v2 datatype")


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (0 for BYTES)."""
    if datatype == "BYTES":
        return 0
    if datatype == "BF16":
        return 2
    return numpy_dtype(datatype).itemsize


def serialize_bytes_tensor(array: np.ndarray[Any, Any]) -> bytes:
    """Encode a BYTES tensor: each element as a 4-byte little-endian length and its bytes, row-major."""
    parts: list[bytes] = []
    pack = struct.Struct("<I").pack
    for item in array.reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


MAX_DIMS = 32
"""The most dimensions a tensor may have: what numpy holds (32 before numpy 2, 64 since)."""


def element_count(shape: Sequence[int], dtype: np.dtype[Any], label: str) -> int:
    """The number of elements of ``shape``, once the shape is one an array of ``dtype`` can have: no negative
    dimension, at most MAX_DIMS of them, and not more elements than memory can address (counted without the zero
    dimensions, as numpy counts them: [0, 2**62, 4] FP32 holds no element, yet no array has that shape).
    Anything else is an InvalidArgument naming ``label`` and the shape."""
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{label}: shape {list(shape)} has a negative dimension")
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{label}: shape {list(shape)} has {len(shape)} dimensions, at most {MAX_DIMS} are taken")
    if math.prod(d for d in shape if d) * dtype.itemsize > sys.maxsize:
        raise InvalidArgument(f"{label}: shape {list(shape)} has more elements than any tensor can hold")
    return math.prod(shape)


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int, label: str) -> np.ndarray[Any, Any]:
    """Decode ``count`` length-prefixed elements; the buffer must hold exactly them."""
    view = memoryview(buffer)
    end = len(view)
    if count > end // 4:  # each element takes 4 bytes at least: refused before an array of ``count`` is made
        raise InvalidArgument(
            f"{label}: BYTES data holds at most {end // 4} elements in its {end} bytes, shape needs {count}"
        )
    out = np.empty(count, dtype=np.object_)
    offset = 0
    unpack = struct.Struct("<I").unpack_from
    for i in range(count):
        if offset + 4 > end:
            raise InvalidArgument(f"{label}: BYTES data holds {i} elements, shape needs {count}")
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > end:
            raise InvalidArgument(f"{label}: BYTES element {i} runs past the end of its data")
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise InvalidArgument(f"{label}: BYTES data has {end - offset} bytes left over after {count} elements")
    return out


def to_bytes_elements(values: Iterable[Any], label: str) -> list[bytes]:
    """JSON BYTES elements (strings, or bytes from typed callers) as bytes."""
    out: list[bytes] = []
    for v in values:
        if isinstance(v, str):
            out.append(v.encode("utf-8"))
        elif isinstance(v, bytes | bytearray):
            out.append(bytes(v))
        else:
            raise InvalidArgument(f"{label}: BYTES elements must be strings, got {type(v).__name__}")
    return out


def tensor_bytes(datatype: str, data: np.ndarray[Any, Any]) -> bytes:
    """A tensor's bytes as the v2 protocol carries them (HTTP binary data, gRPC raw contents): BYTES serialized with
    their 4-byte lengths, any other datatype its elements in C order (BF16, from ml_dtypes: its 16-bit words)."""
    if datatype == "BYTES":
        return serialize_bytes_tensor(data)
    return np.ascontiguousarray(data).tobytes()
