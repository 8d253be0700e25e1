"""Fuzzing the gRPC server's HTTP/2 frame parser (``modelsvc/server/grpc/h2/_connection.py``): any bytes a client may
send, mostly frames of every type with valid, odd or wrong payloads, split at any points.

The connection is the server's own ``H2Connection``; a transport that keeps what is written stands in for the
socket, and a handler that keeps the streams it is given stands in for the gRPC methods. What must hold: feeding
bytes never raises and nothing raises later in the event loop's callbacks; a connection closed on a protocol error
said why with a GOAWAY first; every stream opened has its headers as (bytes, bytes) pairs.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import hpack
from hypothesis import strategies as st

from loadtests.fuzz._protocol import Target
from modelsvc.server.grpc.h2._connection import H2Connection
from modelsvc.server.grpc.h2._frames import (
    CONTINUATION,
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
)
from modelsvc.server.grpc.h2._stream import H2Stream

_HEAD = struct.Struct(">IBI")
_REQUEST_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"fuzz"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


@dataclass
class Frames:
    """What a client sends, in the pieces it arrives in."""

    chunks: list[bytes]

    def __repr__(self) -> str:
        return f"Frames({b''.join(self.chunks)!r:.600}, {len(self.chunks)} chunks)"


def _frame(ftype: int, flags: int, sid: int, payload: bytes, length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return _HEAD.pack((size & 0xFFFFFF) << 8 | ftype, flags, sid) + payload


@st.composite
def _header_block(draw: st.DrawFn) -> bytes:
    headers = list(_REQUEST_HEADERS)
    if draw(st.booleans()):
        headers.append((b"grpc-timeout", draw(st.sampled_from([b"1S", b"99999999H", b"x", b"", b"5n"]))))
    if draw(st.booleans()):
        headers.append((b"grpc-encoding", draw(st.sampled_from([b"gzip", b"deflate", b"br", b"identity"]))))
    if draw(st.booleans()):
        headers.append((draw(st.binary(min_size=1, max_size=8)).lower(), draw(st.binary(max_size=12))))
    block: bytes = hpack.Encoder().encode(draw(st.permutations(headers)))
    return block if draw(st.integers(0, 3)) else draw(st.binary(max_size=30))


@st.composite
def _payload(draw: st.DrawFn, ftype: int) -> bytes:
    if ftype in (HEADERS, CONTINUATION):
        block: bytes = draw(_header_block())
        return block
    if ftype == DATA:
        message = draw(st.binary(max_size=40))
        flag = draw(st.sampled_from([b"\x00", b"\x00", b"\x01", b"\x02"]))
        length = draw(st.one_of(st.just(len(message)), st.integers(0, 2**32 - 1)))
        return flag + struct.pack(">I", length) + message
    if ftype == SETTINGS:
        pairs = draw(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2**32 - 1)), max_size=4))
        raw = b"".join(struct.pack(">HI", k, v) for k, v in pairs)
        return raw if draw(st.integers(0, 4)) else raw + b"\x00"
    if ftype in (WINDOW_UPDATE, RST_STREAM):
        return struct.pack(">I", draw(st.integers(0, 2**32 - 1))) if draw(st.integers(0, 4)) else b"\x00"
    if ftype in (PING, GOAWAY):
        return draw(st.binary(min_size=8, max_size=12))
    return draw(st.binary(max_size=20))


@st.composite
def _one_frame(draw: st.DrawFn) -> bytes:
    ftype = draw(st.one_of(st.sampled_from([HEADERS, DATA, DATA, SETTINGS, WINDOW_UPDATE, CONTINUATION]),
                           st.integers(0, 12)))  # fmt: skip
    flags = draw(st.one_of(st.sampled_from([0, 0x1, 0x4, 0x5]), st.integers(0, 255)))
    sid = draw(st.one_of(st.sampled_from([1, 1, 3, 5]), st.sampled_from([0, 2, 2**31 - 1, 2**32 - 1])))
    payload = draw(_payload(ftype))
    if flags & 0x8 and draw(st.booleans()):  # PADDED: a pad length, maybe longer than the frame
        payload = bytes([draw(st.integers(0, 255))]) + payload
    length = None if draw(st.integers(0, 19)) else draw(st.integers(0, 2**24 - 1))  # a length that lies
    return _frame(ftype, flags, sid, payload, length)


@st.composite
def frames(draw: st.DrawFn) -> Frames:
    """The connection preface (or something like it), frames, then the bytes cut into pieces."""
    start = draw(st.sampled_from([PREFACE, PREFACE, PREFACE, PREFACE[:10], b"GET / HTTP/1.1\r\n\r\n", b""]))
    if draw(st.integers(0, 3)):  # a call as a client makes it, then whatever follows
        block = hpack.Encoder().encode(_REQUEST_HEADERS)
        message = draw(st.binary(max_size=30))
        start += _frame(SETTINGS, 0, 0, b"") + _frame(HEADERS, 0x4, 1, block)
        start += _frame(DATA, draw(st.sampled_from([0, 1])), 1, b"\x00" + struct.pack(">I", len(message)) + message)
    data = start + b"".join(draw(st.lists(_one_frame(), max_size=6)))
    if draw(st.integers(0, 5)) == 0:
        data += draw(st.binary(max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return Frames([c for c in chunks if c])


class _Transport(asyncio.Transport):
    """Keeps what is written; closing is only noted."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += part

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Handler:
    def __init__(self) -> None:
        self.streams: list[H2Stream] = []

    def open(self, stream: H2Stream) -> None:
        self.streams.append(stream)


def _frame_types(written: bytes) -> list[int]:
    """The types of the frames this side wrote, in order."""
    types, pos = [], 0
    while pos + 9 <= len(written):
        head, _, _ = _HEAD.unpack_from(written, pos)
        types.append(head & 0xFF)
        pos += 9 + (head >> 8)
    return types


async def _feed(case: Frames) -> str:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    handler = _Handler()
    conn = H2Connection(handler, 1 << 20, lambda _: None)
    transport = _Transport()
    conn.connection_made(transport)
    for chunk in case.chunks:
        if transport.closed:
            break
        conn.data_received(chunk)
    await asyncio.sleep(0)  # the writes queued for the end of this turn of the loop
    conn.connection_lost(None)
    await asyncio.sleep(0)
    assert not errors, errors[0].get("exception") or errors[0].get("message")
    for stream in handler.streams:
        assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in stream.headers)
    if transport.closed:
        assert GOAWAY in _frame_types(bytes(transport.written)), "closed without a GOAWAY"
        return "closed with GOAWAY"
    return f"{min(len(handler.streams), 2)}{'+' if len(handler.streams) > 2 else ''} streams opened"


def check_frames(case: Frames) -> str:
    return asyncio.run(_feed(case))


TARGETS = [Target("grpc h2 frames", frames(), check_frames)]
