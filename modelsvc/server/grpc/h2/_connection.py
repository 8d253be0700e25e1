"""HTTP/2 as gRPC uses it (RFC 9113, server side), on an asyncio Protocol in the server's own event loop.

The gRPC transport of ``modelsvc serve`` runs on this instead of grpcio's server: grpcio's C core hands every call
between its own threads and the event loop, which cost several times modelsvc's whole HTTP request path (see
loadtests/README.md). This module knows frames, flow control and header compression; it knows nothing of gRPC's
methods: a ``CallHandler`` (``grpc._calls``) gets each new stream and reads and answers it through ``H2Stream``.

What the peer may do and what it gets:
- Frames: DATA, HEADERS (+ CONTINUATION, padding, priority), RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE;
  PRIORITY and unknown types are ignored, PUSH_PROMISE from a client is a connection error.
- Flow control: the receive windows (``H2Limits``: a few MiB per connection and per stream) are opened again as
  the calls read their messages, not as bytes arrive, so what a connection holds unread is bounded; a message
  larger than a window gets the window it needs (a stream's at once, the connection's once it is spent, one
  message at a time). What this side sends respects the client's windows and SETTINGS_MAX_FRAME_SIZE and waits
  for WINDOW_UPDATE when a window is spent.
- Bounds (``_limits``): SETTINGS_MAX_CONCURRENT_STREAMS (REFUSED_STREAM beyond it); a header block larger than
  ``max_metadata_size`` closes the connection as it arrives (ENHANCE_YOUR_CALM), as does a peer that resets far
  more streams than this side completes (rapid reset); when what the transport has not sent yet passes
  ``write_buffer`` the connection is not read until it drains (a peer that does not read its PING answers stops
  being read); the request bytes all connections hold unread share a process-wide ``Budget``: past it new
  streams get RESOURCE_EXHAUSTED and the connection holding the most is closed.
- Header compression: HPACK (the ``hpack`` package decodes); a header block made only of indexed fields (what a
  client sends for its second and later calls) leaves the dynamic table as it is, so its decoding is remembered.
  Answers are encoded without the dynamic table (literal fields, static names).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol, cast

import hpack

from ._frames import (
    _CACHED_BLOCKS,
    _HEAD,
    _SETTING,
    _U32,
    ACK,
    CANCEL,
    CLOSE_AFTER_S,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_CONTROL_FRAME,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RECV_MAX_FRAME,
    REFUSED_STREAM,
    RESPONSE_HEADERS,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    WINDOW_UPDATE,
    MessageError,
    Pieces,
    StreamReset,
    _ConnectionError,
    frame,
    literal,
)
from ._inflow import Inflow
from ._limits import Budget, H2Limits
from ._stream import H2Stream

logger = logging.getLogger("modelsvc.grpc")

__all__ = [  # what the call layer and the tests take from here
    "CLOSE_AFTER_S", "GOAWAY", "PING", "PREFACE", "SETTINGS", "Budget", "H2Connection", "H2Limits", "H2Stream",
    "MessageError", "Pieces", "StreamReset", "frame", "literal",
]  # fmt: skip

_OVER_BUDGET = (
    RESPONSE_HEADERS
    + literal(b"grpc-status", b"8")
    + literal(b"grpc-message", b"the server holds too many request bytes: try again later")
)  # RESOURCE_EXHAUSTED, trailers only


class CallHandler(Protocol):
    def open(self, stream: H2Stream) -> None:
        """A stream's headers arrived (``stream.headers``); read its messages and answer it."""


class H2Connection(Inflow, asyncio.Protocol):
    """One client connection."""

    def __init__(
        self,
        handler: CallHandler,
        max_message: int,
        on_close: Callable[[H2Connection], None],
        limits: H2Limits | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.handler = handler
        self.max_message = max_message
        self._on_close = on_close
        self.limits = limits = limits or H2Limits()
        self.budget = budget if budget is not None else Budget(limits.buffer_budget)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self.last_sid = 0
        self.going_away = False
        self._buffer = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max(64 * 1024, limits.max_metadata_size)
        self._indexed: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._continuing: tuple[int, int, bytearray] | None = None  # (stream id, flags, block so far)
        self._block_size = 0  # bytes of the header block being continued
        self._max_block = limits.max_metadata_size
        self._max_streams = limits.max_concurrent_streams
        self._stream_window = limits.stream_window
        self.peer_initial_window = 65535
        self.peer_max_frame = 16384
        self.send_window = 65535
        # receiving: what the peer may still send, what the calls have not read, one message let past the window
        self.recv_window = MAX_WINDOW
        self.held = 0
        self.reserved = 0
        self._waiting: dict[int, H2Stream] = {}
        self._data_seen = False
        self._resets = 0  # streams the peer reset, less those this side completed
        self._calm = 0.0  # PINGs and SETTINGS since the last HEADERS or DATA, less one a second
        self._calm_at = 0.0
        self._blocked: dict[int, H2Stream] = {}
        self._out: list[bytes | memoryview] = []
        self.idle: asyncio.Event = asyncio.Event()
        self.idle.set()

    # -- asyncio.Protocol -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        limits = self.limits
        with contextlib.suppress(NotImplementedError):  # (a transport that stands in for a socket in tests)
            self.transport.set_write_buffer_limits(high=limits.write_buffer)
        self.budget.holders.add(self)
        settings = b"".join(
            _SETTING.pack(key, value)
            for key, value in (
                (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (SETTINGS_MAX_FRAME_SIZE, RECV_MAX_FRAME),
                (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_metadata_size),
            )
        )
        self._write([frame(SETTINGS, 0, 0, settings), frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - 65535))])

    def connection_lost(self, exc: Exception | None) -> None:
        for stream in list(self.streams.values()):
            stream._on_reset()
        self.streams.clear()
        self._blocked.clear()
        self._let_go()
        self.idle.set()
        self._on_close(self)

    def pause_writing(self) -> None:
        """The transport holds more than ``write_buffer`` unsent: read nothing more until it drains."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if buffer:
            buffer += data
            view = memoryview(buffer)
        else:
            view = memoryview(data)
        try:
            used = self._frames(view)
        except _ConnectionError as exc:
            self.close(exc.code, str(exc))
            return
        finally:
            view.release()
        if buffer:
            del buffer[:used]
        elif used < len(data):
            buffer += data[used:]
        if self._data_seen:
            self._data_seen = False
            if self.budget.used > self.budget.limit:
                self.budget.reclaim(ENHANCE_YOUR_CALM)

    def _frames(self, view: memoryview) -> int:
        pos = 0
        if not self._preface:
            if len(view) < len(PREFACE):
                if bytes(view) != PREFACE[: len(view)]:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return 0
            if view[: len(PREFACE)] != PREFACE:
                raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = True
            pos = len(PREFACE)
        end = len(view)
        while end - pos >= 9:
            head, flags, sid = _HEAD.unpack_from(view, pos)
            length = head >> 8
            ftype = head & 0xFF
            if ftype == DATA:  # checked before any of it is kept
                if length > self.recv_window:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, f"a DATA frame of {length} bytes over the window")
            elif length + self._block_size > self._max_block and ftype in (HEADERS, CONTINUATION):
                raise _ConnectionError(ENHANCE_YOUR_CALM, f"a header block over {self._max_block} bytes")
            elif length > MAX_CONTROL_FRAME:
                raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of type {ftype} and {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            self._frame(ftype, flags, sid & 0x7FFFFFFF, view[pos + 9 : stop])
            pos = stop
            if self.transport is None or self.transport.is_closing():
                break  # closed on a connection error: nothing after it is read
        return pos

    def _frame(self, ftype: int, flags: int, sid: int, payload: memoryview) -> None:
        if self._continuing is not None and ftype != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if ftype == DATA:
            self._data(flags, sid, payload)
            self._calm = 0.0
        elif ftype == HEADERS:
            self._headers(flags, sid, payload)
            self._calm = 0.0
        elif ftype == CONTINUATION:
            if self._continuing is None or self._continuing[0] != sid:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._continuing[2].extend(payload)
            self._block_size += len(payload)
            if flags & END_HEADERS:
                start_sid, start_flags, block = self._continuing
                self._continuing = None
                self._block_size = 0
                self._header_block(start_sid, start_flags, bytes(block))
        elif ftype == SETTINGS:
            if not flags & ACK:
                self._asked()
            self._settings(flags, payload)
        elif ftype == PING:
            if not flags & ACK:
                self._asked()
                self._write([frame(PING, ACK, 0, bytes(payload))])
        elif ftype == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                self._forget(stream)
                stream._on_reset()
                self._resets += 1
                if self._resets > self.limits.max_reset_streams:
                    raise _ConnectionError(ENHANCE_YOUR_CALM, f"{self._resets} more streams reset than completed")
                self._check_idle()
        elif ftype == GOAWAY:
            self.going_away = True
            self._check_idle()
        elif ftype == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored

    def _headers(self, flags: int, sid: int, payload: memoryview) -> None:
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, bytes(block))
        else:
            self._continuing = (sid, flags, bytearray(block))
            self._block_size = len(payload)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        cached = self._indexed.get(block)
        if cached is not None:
            return cached
        try:
            headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        except hpack.HPACKError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, f"a header block could not be decoded: {exc}") from None
        if all(b & 0x80 for b in block):  # indexed fields only: the table stays as it is
            if len(self._indexed) >= _CACHED_BLOCKS:
                self._indexed.clear()
            self._indexed[block] = headers
        else:
            self._indexed.clear()
        return headers

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)  # always, in order: the decoder's table follows every block
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only its end matters
            if flags & END_STREAM:
                stream.ended = True
                stream._wake()
            return
        if sid % 2 == 0 or sid <= self.last_sid:
            if sid % 2 == 0:
                raise _ConnectionError(PROTOCOL_ERROR, f"stream {sid} is not a client's")
            return  # a stream that ended already
        self.last_sid = sid
        if self.going_away or len(self.streams) >= self._max_streams or self.budget.used >= self.budget.limit:
            if self.going_away or len(self.streams) >= self._max_streams:
                self._write([frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM))])
            else:  # the process holds all the request bytes it may
                self._write([frame(HEADERS, END_HEADERS | END_STREAM, sid, _OVER_BUDGET)])
            return
        stream = H2Stream(self, sid, headers, self._stream_window)
        if flags & END_STREAM:
            stream.ended = True
        self.streams[sid] = stream
        self.idle.clear()
        self.handler.open(stream)

    def _settings(self, flags: int, payload: memoryview) -> None:
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of odd length")
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.peer_max_frame = value
        self._write([frame(SETTINGS, ACK, 0)])
        self._resume()

    def _window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not of 4 bytes")
        increment = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            self.send_window += increment
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return
            stream.send_window += increment
        self._resume()

    # -- sending --------------------------------------------------------------------------------------------
    def _write(self, parts: list[bytes | memoryview]) -> None:
        """Queue frames; they go out together at the end of this turn of the loop (the answers of one batch
        in one system call)."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            self.loop.call_soon(self._send_out)
        self._out.extend(parts)

    def _send_out(self) -> None:
        out, self._out = self._out, []
        transport = self.transport
        if not out or transport is None or transport.is_closing():
            return
        if len(out) == 1:
            transport.write(out[0])
        elif sum(map(len, out)) <= 65536:
            transport.write(b"".join(out))
        else:  # the large pieces as they are, the small ones joined (each piece the transport keeps costs ~200 B)
            parts: list[bytes | memoryview] = []
            small: list[bytes | memoryview] = []
            for part in out:
                if len(part) < 16384:
                    small.append(part)
                    continue
                if small:
                    parts.append(b"".join(small))
                    small = []
                parts.append(part)
            if small:
                parts.append(b"".join(small))
            transport.writelines(parts)

    def flush(self, stream: H2Stream, out: list[bytes | memoryview]) -> None:
        self._calm = 0.0  # an answer goes out: the peer's PINGs may be its own flow control's (BDP probes)
        stream._take(out)
        if stream.blocked:
            self._blocked[stream.sid] = stream
        if out:
            self._write(out)

    def _resume(self) -> None:
        """Windows opened: send what waited, stream by stream."""
        if not self._blocked:
            return
        out: list[bytes | memoryview] = []
        for sid, stream in list(self._blocked.items()):
            stream._take(out)
            if not stream.blocked:
                self._blocked.pop(sid, None)
            if self.send_window <= 0:
                break
        if out:
            self._write(out)

    def answered(self, stream: H2Stream, frames: bytes) -> None:
        """A whole answer (headers, message, trailers) in ``frames``, which the windows have room for."""
        self._calm = 0.0
        self._write([frames])
        self.stream_closed(stream)

    def stream_closed(self, stream: H2Stream) -> None:
        """This side ended the stream; what the client still sends on it is dropped. (No RST_STREAM NO_ERROR to
        stop it: grpc's C core reads one that follows the trailers as the call's failure.)"""
        self._forget(stream)
        if self._resets:
            self._resets -= 1
        self._check_idle()

    def reset_stream(self, stream: H2Stream, code: int = CANCEL) -> None:
        """Abandon a stream this side cannot answer any more."""
        if stream.closed or stream.reset:
            return
        self._forget(stream)
        stream.closed = True
        self._write([frame(RST_STREAM, 0, stream.sid, _U32.pack(code))])
        stream._on_reset()
        self._check_idle()

    def _check_idle(self) -> None:
        if not self.streams:
            self.idle.set()
            if self.going_away and self.transport is not None and not self.transport.is_closing():
                # the client closes a connection it was told to leave once its calls ended; closing it here
                # could drop the last answers (a close with unread input sends a TCP reset): a late close only
                self.loop.call_later(CLOSE_AFTER_S, self.close)

    def go_away(self) -> None:
        """No new streams; the connection closes once those open have ended."""
        if self.going_away:
            return
        self.going_away = True
        self._write([frame(GOAWAY, 0, 0, _U32.pack(self.last_sid) + _U32.pack(NO_ERROR))])
        self._check_idle()

    def close(self, code: int = NO_ERROR, reason: str = "") -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if code != NO_ERROR:
            logger.info("closing a gRPC connection: %s", reason)
        debug = reason.encode("utf-8", "replace")[:256]
        self._write([frame(GOAWAY, 0, 0, _U32.pack(self.last_sid) + _U32.pack(code) + debug)])
        self._send_out()
        self.transport.close()
        self._let_go()  # now: the budget counts it no more, though connection_lost comes later
        # a peer that does not read would keep it open (unsent bytes hold the close back): not for long
        self.loop.call_later(CLOSE_AFTER_S, self.transport.abort)
