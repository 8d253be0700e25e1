"""pb_utils tensors: ``Tensor`` (numpy arrays kept as they are, DLPack both ways), Triton's datatype numbers
and the helpers that convert between config type names, those numbers and numpy types, and BYTES data."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from modelsvc.protocol import CONFIG_TO_WIRE, NUMPY_DTYPES, InvalidArgument, serialize_bytes_tensor, wire_datatype

from ._pb_errors import TritonModelException

#: v2 datatype -> Triton's TRITONSERVER_DataType number (what ``Tensor.triton_dtype()`` answers)
_TRITON_DTYPE_NUMBERS: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}

#: model config type name (``TYPE_FP32``) -> numpy scalar type
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    name: NUMPY_DTYPES[wire].type for name, wire in CONFIG_TO_WIRE.items() if wire in NUMPY_DTYPES
}


def _bytes_array(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """An object array of ``bytes`` with the shape of ``array``: str elements encoded as UTF-8, other
    objects as the UTF-8 of their ``str``, as Triton serializes them."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    for i, item in enumerate(flat):
        if isinstance(item, bytes):
            out[i] = item
        elif isinstance(item, bytearray | memoryview):
            out[i] = bytes(item)
        else:
            out[i] = str(item).encode("utf-8")
    return out.reshape(array.shape)


def _all_bytes(array: np.ndarray[Any, Any]) -> bool:
    return all(type(item) is bytes for item in array.reshape(-1))


class _DLPackCapsule:
    """Lets numpy read a bare DLPack capsule (numpy takes objects with ``__dlpack__``, not capsules)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: modelsvc tensors live in host memory


class Tensor:
    """A named tensor: an input of a request, an output of a response. ``numpy_array`` is kept, not copied.

    Arrays of numpy ``str`` or ``bytes`` become object arrays of ``bytes`` (BYTES tensors).
    """

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind in ("U", "S"):
            array = _bytes_array(array)
        self._name = name
        self._array = array

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray[Any, Any]) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """Triton's TRITONSERVER_DataType number (FP32 is 11, BYTES 13)."""
        try:
            return _TRITON_DTYPE_NUMBERS[wire_datatype(self._array.dtype)]
        except InvalidArgument:
            return 0

    def is_cpu(self) -> bool:
        """Always True: modelsvc hands python models tensors in host memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data, without a copy (numeric tensors only)."""
        if self._array.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_object: Any) -> Tensor:
        """A tensor over the memory of a DLPack capsule, or of an object with ``__dlpack__`` (host memory only)."""
        source = dlpack_object if hasattr(dlpack_object, "__dlpack__") else _DLPackCapsule(dlpack_object)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise TritonModelException(f"tensor '{name}': cannot read the DLPack data: {exc}") from exc
        if not array.flags.c_contiguous:
            raise TritonModelException(f"tensor '{name}': DLPack tensors must be C-contiguous")
        return Tensor._wrap(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={list(self._array.shape)})"


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type for a config type name: ``TYPE_FP32`` -> ``np.float32``, ``TYPE_STRING`` -> ``np.object_``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type for a TRITONSERVER_DataType number, or None."""
    for wire, number in _TRITON_DTYPE_NUMBERS.items():
        if number == data_type and wire in NUMPY_DTYPES:
            return NUMPY_DTYPES[wire].type
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number for a numpy type or dtype, or None."""
    try:
        return _TRITON_DTYPE_NUMBERS[wire_datatype(np.dtype(data_type))]
    except (InvalidArgument, TypeError):
        return None


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """The elements of a BYTES tensor, each as a 4-byte little-endian length and its bytes, as uint8."""
    if input_tensor.size == 0:
        return None
    if input_tensor.dtype.kind not in ("O", "S", "U"):
        return None
    return np.frombuffer(serialize_bytes_tensor(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The elements of serialized BYTES data, as a 1-D object array of ``bytes``."""
    data = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else bytes(encoded_tensor)
    items: list[bytes] = []
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        items.append(data[offset : offset + length])
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out
