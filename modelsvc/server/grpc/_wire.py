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

from ...protocol import InferResponse, Tensor, serialize_bytes_tensor

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


_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
SPLIT_FROM = 65536
"""Requests at least this large have their raw inputs taken as views of the received bytes (below, protobuf's
parse copies less than the scan costs)."""


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def split_raw_inputs(message: bytes) -> tuple[bytes, list[memoryview]]:
    """A ModelInferRequest's encoding as (the encoding of everything but ``raw_input_contents``, those contents as
    views of ``message``): the top-level fields are walked, nothing below them. ValueError: not a valid encoding."""
    view = memoryview(message)
    end = len(view)
    kept: list[memoryview] = []
    raws: list[memoryview] = []
    pos = 0
    try:
        while pos < end:
            start = pos
            key, pos = _read_varint(view, pos)
            wire = key & 7
            if wire == 0:
                _, pos = _read_varint(view, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _read_varint(view, pos)
                if key >> 3 == _RAW_INPUT_FIELD:
                    if pos + length > end:
                        raise ValueError("a field runs past the end of the message")
                    raws.append(view[pos : pos + length])
                    pos += length
                    continue
                pos += length
            else:
                raise ValueError(f"wire type {wire}")
            if pos > end:
                raise ValueError("a field runs past the end of the message")
            kept.append(view[start:pos])
    except IndexError:
        raise ValueError("the message ends inside a field") from None
    return b"".join(kept), raws


class RawInputsRequest:
    """A parsed ModelInferRequest whose ``raw_input_contents`` are views of the received bytes."""

    __slots__ = ("_message", "raw_input_contents")

    def __init__(self, message: Any, raws: list[memoryview]) -> None:
        self._message = message
        self.raw_input_contents = raws

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)
