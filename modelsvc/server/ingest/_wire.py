"""What an ingest worker and the engine say to each other: framed msgpack messages over one Unix socket each.

A frame is a 4-byte little-endian length and a msgpack message (``msgspec``, C code both ways). Tensors travel as
their v2 bytes: inline in the frame while small, and above ``SHARED_FROM`` bytes in a shared-memory arena the
sender owns (``_arena``), the message carrying only where they are. Either way Python touches no byte: msgspec and
numpy copy in C, and the receiver's arrays are views on the frame or on the arena.

The messages (``array_like``: a list on the wire, no field names):

- worker -> engine: ``Hello`` (first: which worker), ``Listening`` (its ports are open), ``Call`` (one request),
  ``Cancel`` (its client went away), ``Release`` (output blocks of the engine's arena the worker has written out);
- engine -> worker: ``Welcome`` (first: its arenas are ready), ``Reply`` (a response or an
  error).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from ...protocol import (
    ERROR_TYPES,
    ErrorKind,
    InferRequest,
    InferResponse,
    InternalError,
    ModelsvcError,
    RequestedOutput,
    Tensor,
    deserialize_bytes_tensor,
    numpy_dtype,
    tensor_bytes,
)

SHARED_FROM = 64 * 1024
"""Tensors of this many bytes or more go through the shared-memory arena (when it has room); smaller ones inline."""

HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 31


class WireTensor(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any]
    data: memoryview | None
    """The tensor's v2 bytes, inline; None when they are in the arena at ``block``."""
    block: tuple[int, int] | None = None
    """(offset, length) in the sender's arena."""


class WireOutput(msgspec.Struct, array_like=True):
    name: str
    binary: bool | None
    parameters: dict[str, Any]


class Call(msgspec.Struct, array_like=True, tag=1):
    id: int
    model: str
    version: str | None
    endpoint: str | None
    request_id: str | None
    parameters: dict[str, Any]
    inputs: list[WireTensor]
    outputs: list[WireOutput] | None
    trace_headers: list[tuple[bytes, bytes]] | None


class Cancel(msgspec.Struct, array_like=True, tag=2):
    id: int


class Release(msgspec.Struct, array_like=True, tag=3):
    blocks: list[tuple[int, int]]


class WireError(msgspec.Struct, array_like=True):
    kind: str
    message: str
    decoupled_refused: bool = False


class Reply(msgspec.Struct, array_like=True, tag=4):
    id: int
    final: bool
    model_name: str | None = None
    model_version: str | None = None
    request_id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[WireTensor] | None = None
    error: WireError | None = None
    """Set when the request (or, in a stream, this one response) failed; the other fields are then unset."""


class Hello(msgspec.Struct, array_like=True, tag=5):
    """A worker's first message: who it is (its index names the arenas the engine made for it)."""

    pid: int
    index: int


class Welcome(msgspec.Struct, array_like=True, tag=6):
    """The engine's answer: it has this worker's arenas mapped."""


class Listening(msgspec.Struct, array_like=True, tag=7):
    """A worker has opened its ports: from now on the kernel hands it connections."""


ToEngine = Call | Cancel | Release | Hello | Listening
ToWorker = Reply | Welcome

_encoder = msgspec.msgpack.Encoder()
_to_engine = msgspec.msgpack.Decoder(ToEngine)
_to_worker = msgspec.msgpack.Decoder(ToWorker)


def frame(message: msgspec.Struct) -> bytes:
    """``message`` framed; one of ``MAX_FRAME`` bytes or more is refused here (its reader would end the link)."""
    body = _encoder.encode(message)
    if len(body) >= MAX_FRAME:
        raise InternalError(f"a message of {len(body)} bytes is over the ingest channel's limit ({MAX_FRAME} bytes)")
    return HEADER.pack(len(body)) + body


def decode_to_engine(body: memoryview) -> Call | Cancel | Release | Hello | Listening:
    return _to_engine.decode(body)  # type: ignore[no-any-return]


def decode_to_worker(body: memoryview) -> Reply | Welcome:
    return _to_worker.decode(body)  # type: ignore[no-any-return]


class Outbox:
    """What one end of the channel sends: the frames queued within one turn of the event loop, written in one write
    at its end (``gather``: more messages to add just before, e.g. the blocks released meanwhile)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gather: Callable[[], list[Any]] | None = None) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._frames: list[bytes] = []
        self._scheduled = False
        self._gather = gather

    def send(self, message: msgspec.Struct) -> None:
        self._frames.append(frame(message))  # (here, so that a frame over MAX_FRAME fails its sender)
        self.wake()

    def wake(self) -> None:
        """Flush at the end of this turn of the loop."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._gather is not None:
            self._frames += [frame(message) for message in self._gather()]
        frames, self._frames = self._frames, []
        if self.transport is not None and frames:
            self.transport.write(b"".join(frames) if len(frames) > 1 else frames[0])


class FrameReader:
    """Cuts a byte stream into frames; a frame that arrived whole in one chunk is a view on that chunk. One that
    comes in many chunks is joined once, when it is whole (its header says how much to wait for)."""

    __slots__ = ("_need", "_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._need = HEADER.size

    def feed(self, data: bytes) -> list[memoryview]:
        if self._parts:
            self._parts.append(data)
            self._size += len(data)
            if self._size < self._need:
                return []
            data = b"".join(self._parts)
            self._parts.clear()
            self._size = 0
            self._need = HEADER.size
        view = memoryview(data)
        frames: list[memoryview] = []
        offset, end = 0, len(view)
        while end - offset >= HEADER.size:
            (length,) = HEADER.unpack_from(view, offset)
            if length >= MAX_FRAME:
                raise ValueError(f"frame of {length} bytes")
            stop = offset + HEADER.size + length
            if stop > end:
                break
            frames.append(view[offset + HEADER.size : stop])
            offset = stop
        if offset < end:
            rest = bytes(view[offset:])
            self._parts.append(rest)
            self._size = len(rest)
            if len(rest) >= HEADER.size:  # the frame's length is known: wait for all of it
                self._need = HEADER.size + HEADER.unpack_from(rest)[0]
        return frames


# -- tensors --------------------------------------------------------------------------------------------------


class Arena:
    """Where a sender puts large tensors: ``put`` gives a block (or None when there is no room), ``view`` reads one,
    ``free`` returns it. Implemented in ``_arena`` over ``multiprocessing.shared_memory``."""

    def put(self, data: memoryview) -> tuple[int, int] | None:
        raise NotImplementedError

    def view(self, block: tuple[int, int]) -> memoryview:
        raise NotImplementedError

    def free(self, block: tuple[int, int]) -> None:
        raise NotImplementedError


def _raw(tensor: Tensor) -> memoryview:
    data = tensor.data
    if tensor.datatype == "BYTES" or not data.flags.c_contiguous:
        return memoryview(tensor_bytes(tensor.datatype, data))
    if tensor.datatype == "BF16":  # ml_dtypes' bfloat16 has no buffer of its own: its bytes
        return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    return data.data  # the array's own buffer (msgspec writes any contiguous buffer as bytes)


def pack_tensor(tensor: Tensor, arena: Arena | None, blocks: list[tuple[int, int]]) -> WireTensor:
    """``tensor`` for the wire: its bytes inline, or in ``arena`` (the block appended to ``blocks``)."""
    raw = _raw(tensor)
    if arena is not None and raw.nbytes >= SHARED_FROM:
        block = arena.put(raw)
        if block is not None:
            blocks.append(block)
            return WireTensor(tensor.name, tensor.datatype, list(tensor.shape), tensor.parameters, None, block)
    return WireTensor(tensor.name, tensor.datatype, list(tensor.shape), tensor.parameters, raw)


def unpack_tensor(wire: WireTensor, arena: Arena | None) -> Tensor:
    """The tensor a ``WireTensor`` describes: an array viewing the frame's bytes or the sender's arena."""
    if wire.data is not None:
        raw = wire.data
    elif wire.block is not None and arena is not None:
        raw = arena.view(wire.block)
    else:
        raise InternalError(f"tensor {wire.name}: its data is in an arena this process has not mapped")
    shape = tuple(wire.shape)
    if wire.datatype == "BYTES":
        count = 1
        for d in shape:
            count *= d
        array = deserialize_bytes_tensor(raw, count, wire.name).reshape(shape)
    else:
        array = np.frombuffer(raw, dtype=numpy_dtype(wire.datatype)).reshape(shape)
    return Tensor(wire.name, wire.datatype, shape, array, wire.parameters)


def call_for(
    ident: int,
    model: str,
    version: str | None,
    request: InferRequest,
    *,
    endpoint: str | None,
    trace_headers: list[tuple[bytes, bytes]] | None,
    arena: Arena | None,
    blocks: list[tuple[int, int]],
) -> Call:
    outputs = None
    if request.outputs is not None:
        outputs = [WireOutput(o.name, o.binary, o.parameters) for o in request.outputs]
    inputs = [pack_tensor(t, arena, blocks) for t in request.inputs]
    return Call(
        ident, model, version, endpoint, request.id, request.parameters, inputs, outputs, trace_headers
    )


def request_of(call: Call, arena: Arena | None) -> InferRequest:
    outputs = None
    if call.outputs is not None:
        outputs = [RequestedOutput(o.name, o.binary, o.parameters) for o in call.outputs]
    return InferRequest([unpack_tensor(t, arena) for t in call.inputs], call.request_id, outputs, call.parameters)


def reply_for(
    ident: int, response: InferResponse | None, final: bool, arena: Arena | None, blocks: list[tuple[int, int]]
) -> Reply:
    if response is None:  # a decoupled model's final flag without a response
        return Reply(ident, final)
    outputs = [pack_tensor(t, arena, blocks) for t in response.outputs]
    return Reply(
        ident, final, response.model_name, response.model_version, response.id, response.parameters, outputs
    )


def response_of(reply: Reply, arena: Arena | None) -> InferResponse:
    return InferResponse(
        reply.model_name or "",
        reply.model_version or "",
        [unpack_tensor(t, arena) for t in reply.outputs or ()],
        reply.request_id,
        reply.parameters or {},
    )


INTERNAL_MESSAGE = "internal server error; see the server log"


def error_reply(ident: int, exc: BaseException, final: bool = True) -> Reply:
    if isinstance(exc, ModelsvcError):
        refused = getattr(exc, "http_status", None) == 501
        return Reply(ident, final, error=WireError(exc.kind.value, exc.message, refused))
    return Reply(ident, final, error=WireError(ErrorKind.INTERNAL.value, INTERNAL_MESSAGE))


def error_of(wire: WireError) -> ModelsvcError:
    """The error the engine raised, as the same kind (the doors map it to the same status)."""
    if wire.decoupled_refused:
        from ...engine import DecoupledRefused

        return DecoupledRefused(wire.message)
    try:
        kind = ErrorKind(wire.kind)
    except ValueError:
        kind = ErrorKind.INTERNAL
    return ERROR_TYPES[kind](wire.message)
