"""One HTTP/2 stream of ``_connection``: the gRPC messages that arrive on it (assembled, inflated, size-checked) and
the way back (the answer's headers, its message under flow control, the trailers)."""

from __future__ import annotations

import asyncio
import collections
import struct
import zlib
from typing import Protocol

from ._frames import (
    _HEAD,
    _U32,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    RESPONSE_HEADERS,
    MessageError,
    Pieces,
    StreamReset,
    frame,
)

_ANSWER_HEAD = struct.Struct(">IBIIBIBI")  # the HEADERS frame's head, the DATA frame's head, the message's prefix
_HEADERS_LENGTH = len(RESPONSE_HEADERS) << 8 | HEADERS


class Connection(Protocol):
    """What a stream uses of its connection (``_connection.H2Connection``)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    max_message: int
    peer_initial_window: int
    peer_max_frame: int
    send_window: int

    def flush(self, stream: H2Stream, out: list[bytes | memoryview]) -> None: ...

    def stream_closed(self, stream: H2Stream) -> None: ...

    def reset_stream(self, stream: H2Stream, code: int = ...) -> None: ...

    def consumed(self, stream: H2Stream, size: int) -> None: ...

    def answered(self, stream: H2Stream, frames: bytes) -> None: ...


class H2Stream:
    """One call: its request headers, the gRPC messages that arrive, and the way back."""

    __slots__ = (
        "_buffer",
        "_drained",
        "_outbox",
        "_trailers",
        "_waiter",
        "closed",
        "conn",
        "ended",
        "error",
        "headers",
        "headers_sent",
        "held",
        "max_message",
        "messages",
        "received",
        "recv_window",
        "reserved",
        "reset",
        "send_window",
        "sid",
        "task",
    )  # fmt: skip

    def __init__(self, conn: Connection, sid: int, headers: list[tuple[bytes, bytes]], recv_window: int) -> None:
        self.conn = conn
        self.sid = sid
        self.headers = headers
        self.messages: collections.deque[bytes] = collections.deque()
        self.ended = False  # the peer closed its side (END_STREAM)
        self.reset = False
        self.error: tuple[str, str] | None = None  # a message that could not be taken: (status name, text)
        self.task: asyncio.Task[None] | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self.send_window = conn.peer_initial_window
        self._outbox: collections.deque[memoryview] = collections.deque()
        self._trailers: bytes | None = None
        self.headers_sent = False
        self.closed = False  # this side sent END_STREAM (or reset)
        self._drained: asyncio.Future[None] | None = None
        self.max_message = conn.max_message
        self.recv_window = recv_window  # what the peer may still send on it
        self.received = 0  # request bytes that arrived on it (DATA, without padding)
        self.held = 0  # of those, what is kept unread: the partial message and the queued ones
        self.reserved = 0  # window given beyond the initial one, for messages not yet read

    # -- receiving ------------------------------------------------------------------------------------------
    def _feed(self, data: memoryview) -> None:
        """Take request bytes; ``held`` counts what is kept of them (a message refused is not; one inflated, as
        it is once inflated)."""
        buffer = self._buffer
        if not buffer and len(data) >= 5:  # the usual case: whole messages in one frame, no copy to the buffer
            length = _U32.unpack_from(data, 1)[0]
            if len(data) == 5 + length and not data[0]:
                if length > self.max_message:
                    self._refuse(length)
                else:
                    self.messages.append(data[5:].tobytes())
                    self.held += 5 + length
                return
        elif len(buffer) >= 5 and not buffer[0]:  # the rest of a message begun in an earlier frame
            length = _U32.unpack_from(buffer, 1)[0]
            rest = 5 + length - len(buffer)
            if len(data) >= rest and length <= self.max_message:  # it ends here: one copy from both parts
                with memoryview(buffer) as view:
                    self.messages.append(b"".join((view[5:], data[:rest])))
                self._buffer = bytearray()
                self.held += rest
                if len(data) > rest:
                    self._feed(data[rest:])
                return
        buffer += data
        self.held += len(data)
        while len(buffer) >= 5 and self.error is None:
            length = _U32.unpack_from(buffer, 1)[0]
            if length > self.max_message:
                self._refuse(length)
                return
            if len(buffer) < 5 + length:
                return
            with memoryview(buffer) as view:
                message = view[5 : 5 + length].tobytes()  # one copy (bytes(buffer[...]) made two)
            compressed = buffer[0]
            del buffer[: 5 + length]
            if not compressed:
                self.messages.append(message)
            elif not self._inflate(message):
                self.held -= 5 + length

    def need(self) -> int:
        """Bytes still to come of the message that has begun to arrive (0: none has, or it cannot be taken)."""
        buffer = self._buffer
        if not buffer or self.error is not None or self.ended:
            return 0
        if len(buffer) < 5:
            return 5 - len(buffer)
        length: int = _U32.unpack_from(buffer, 1)[0]
        return 5 + length - len(buffer)

    def _inflate(self, message: bytes) -> bool:
        """A compressed message (flag 1) in the stream's ``grpc-encoding``: gzip and deflate, as grpc offers."""
        encoding = next((v for k, v in self.headers if k == b"grpc-encoding"), b"identity")
        wbits = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}.get(encoding)
        if wbits is None:
            name = encoding.decode("latin-1")
            self.error = ("UNIMPLEMENTED", f"a compressed message in grpc-encoding '{name}': gzip or deflate only")
            self._drop_buffer()
            return False
        inflater = zlib.decompressobj(wbits)
        try:
            plain = inflater.decompress(message, self.max_message + 1)
        except zlib.error as exc:
            self.error = ("INTERNAL", f"a compressed message that does not inflate: {exc}")
            self._drop_buffer()
            return False
        if len(plain) > self.max_message:
            self._refuse(len(plain) + len(inflater.unconsumed_tail))
            return False
        self.messages.append(plain)
        self.held += len(plain) - len(message)  # what is kept is the message inflated (5 + its size, read)
        return True

    def _refuse(self, length: int) -> None:
        self.error = ("RESOURCE_EXHAUSTED", f"Received message larger than max ({length} vs. {self.max_message})")
        self._drop_buffer()

    def _drop_buffer(self) -> None:
        self.held -= len(self._buffer)
        self._buffer = bytearray()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes | None:
        """The next request message; None once the client closed its side. Raises StreamReset, or MessageError
        for a message that could not be taken."""
        while not self.messages:
            if self.error is not None:
                raise MessageError(*self.error)
            if self.reset:
                raise StreamReset
            if self.ended:
                return None
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self.messages.popleft()
        self.conn.consumed(self, 5 + len(message))  # the peer may send that much more
        return message

    # -- sending --------------------------------------------------------------------------------------------
    def _head(self, out: list[bytes | memoryview]) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            out.append(frame(HEADERS, END_HEADERS, self.sid, RESPONSE_HEADERS))

    def send(self, payload: bytes | Pieces | None, trailers: bytes | None) -> None:
        """Queue one message (``payload``: its bytes, or pieces with ``parts`` and ``size``; None: none) and/or
        the trailers that end the call, and send what the windows allow now; the rest goes as the client opens
        them."""
        if self.closed or self.reset:
            return
        if payload is not None and trailers is not None and not self.headers_sent and not self._outbox:
            parts: list[bytes | memoryview] = [payload] if isinstance(payload, bytes) else payload.parts
            size = len(payload) if isinstance(payload, bytes) else payload.size
            conn = self.conn
            if size + 5 <= min(self.send_window, conn.send_window, conn.peer_max_frame, 65536):
                self._answer(parts, size, trailers)  # a whole answer at once: the usual unary call
                return
        out: list[bytes | memoryview] = []
        self._head(out)
        if payload is not None:
            parts = [payload] if isinstance(payload, bytes) else payload.parts
            size = len(payload) if isinstance(payload, bytes) else payload.size
            prefix = b"\x00" + _U32.pack(size)
            if size < 65536:
                self._outbox.append(memoryview(b"".join([prefix, *parts])))
            else:  # a large message is not copied: each piece goes in frames of its own
                self._outbox.append(memoryview(prefix))
                self._outbox.extend(memoryview(p) for p in parts if len(p))
        if trailers is not None:
            self._trailers = trailers
        self.conn.flush(self, out)

    def _answer(self, parts: list[bytes | memoryview], size: int, trailers: bytes) -> None:
        """Headers, the one message and the trailers in one piece, the windows having room for it."""
        sid = self.sid
        self.headers_sent = self.closed = True
        self.send_window -= size + 5
        self.conn.send_window -= size + 5
        head = _ANSWER_HEAD.pack(_HEADERS_LENGTH, END_HEADERS, sid, (size + 5) << 8 | DATA, 0, sid, 0, size)
        end = _HEAD.pack(len(trailers) << 8 | HEADERS, END_HEADERS | END_STREAM, sid)
        self.conn.answered(self, b"".join([head[:9], RESPONSE_HEADERS, head[9:], *parts, end, trailers]))

    async def drain(self) -> None:
        """Until what was queued has gone out (flow control), or the stream is gone."""
        while self._outbox and not self.reset:
            self._drained = self.conn.loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self.reset:
            raise StreamReset

    def _take(self, out: list[bytes | memoryview]) -> None:
        """Move what the windows allow from the outbox into ``out``; then the trailers, once all data went."""
        conn = self.conn
        size = conn.peer_max_frame
        outbox = self._outbox
        while outbox:
            allowed = min(self.send_window, conn.send_window)
            if allowed <= 0:
                return
            chunk = outbox[0]
            n = min(len(chunk), allowed, size)
            out.append(_HEAD.pack(n << 8 | DATA, 0, self.sid))
            out.append(chunk[:n])
            self.send_window -= n
            conn.send_window -= n
            if n == len(chunk):
                outbox.popleft()
            else:
                outbox[0] = chunk[n:]
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._trailers is not None:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, self.sid, self._trailers))
            self._trailers = None
            self.closed = True
            conn.stream_closed(self)

    @property
    def blocked(self) -> bool:
        return bool(self._outbox)

    def _on_reset(self) -> None:
        self.reset = True
        self._outbox.clear()
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self.task is not None and not self.task.done():
            self.task.cancel()
