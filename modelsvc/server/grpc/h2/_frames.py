"""HTTP/2 frames and the HPACK encoding of answers, as ``_connection`` uses them (RFC 9113, RFC 7541); no I/O."""

from __future__ import annotations

import struct
from typing import Protocol

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 1, 3, 4
SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 5, 6

MAX_WINDOW = 2**31 - 1
RECV_MAX_FRAME = (1 << 24) - 1
"""The largest DATA frame taken (SETTINGS_MAX_FRAME_SIZE, HTTP/2's maximum; the receive windows bound it): a large
message arrives in few frames, often one, which the stream then takes without assembling it in a buffer of its
own."""
MAX_CONTROL_FRAME = 1 << 16
"""The largest frame of any other type (PING, SETTINGS, GOAWAY, unknown types...): larger is FRAME_SIZE_ERROR
before it is buffered. (Header blocks have their own bound, ``H2Limits.max_metadata_size``.)"""
_CACHED_BLOCKS = 64
CLOSE_AFTER_S = 2.0
"""How long a connection told to go away (GOAWAY) and without calls is left for its client to close."""

_HEAD = struct.Struct(">IBI")  # length (24 bits) and type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | ftype, flags, sid) + payload


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with ``prefix_bits`` in its first byte, whose other bits are ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes | int, value: bytes) -> bytes:
    """A literal header field without indexing: a static table name (its index) or a new name."""
    if isinstance(name, int):
        return _int(name, 4, 0x00) + _int(len(value), 7, 0) + value
    return b"\x00" + _int(len(name), 7, 0) + name + _int(len(value), 7, 0) + value


RESPONSE_HEADERS = b"\x88" + literal(31, b"application/grpc")  # :status 200 (static 8), content-type (static 31)


class StreamReset(Exception):
    """The peer reset the stream or the connection went away: nothing more can be read or sent on it."""


class MessageError(Exception):
    """A request message that cannot be taken (too large, compressed): its gRPC status name and text."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class Pieces(Protocol):
    """A message as pieces: ``parts`` (bytes-like), ``size`` bytes in all."""

    @property
    def parts(self) -> list[bytes | memoryview]: ...

    @property
    def size(self) -> int: ...


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None
