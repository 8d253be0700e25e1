"""A ``ModelInferResponse`` in wire form without copying its tensors: what ``ModelInfer`` answers on the h2 engine.

Protobuf's encoding of a message is the concatenation of its fields, in any order, and a repeated ``bytes`` field
is one (tag, length, bytes) entry per element. So the answer is the message without ``raw_output_contents``,
serialized by protobuf, followed by one entry per output whose bytes are the output array's own memory: the
transport writes them from there (``H2Stream.send`` takes the pieces), where ``SerializeToString`` would have
copied each output twice more (into the message, then into the encoding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol import InferResponse, Tensor, serialize_bytes_tensor

_RAW_OUTPUT_TAG = b"\x32"  # field 6 (raw_output_contents), wire type 2 (length-delimited)


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class WireAnswer:
    """An encoded message as pieces (bytes and memoryviews over arrays), ``size`` bytes in all."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | memoryview], size: int) -> None:
        self.parts = parts
        self.size = size


def _raw_view(tensor: Tensor) -> bytes | memoryview:
    if tensor.datatype == "BYTES":
        return serialize_bytes_tensor(tensor.data)
    array = np.ascontiguousarray(tensor.data)
    return array.reshape(-1).view(np.uint8).data  # any dtype (BF16 too) as its bytes, not copied


def encode_infer_response_wire(response: InferResponse, head_message: Any) -> WireAnswer:
    """``head_message``: the ModelInferResponse with everything but ``raw_output_contents`` filled in."""
    head = head_message.SerializeToString()
    parts: list[bytes | memoryview] = [head]
    size = len(head)
    for tensor in response.outputs:
        raw = _raw_view(tensor)
        key = _RAW_OUTPUT_TAG + varint(len(raw))
        parts += (key, raw)
        size += len(key) + len(raw)
    return WireAnswer(parts, size)
