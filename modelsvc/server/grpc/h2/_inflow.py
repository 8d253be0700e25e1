"""The receiving side of ``_connection``'s flow control: what a peer may send, and the process-wide ``Budget``.

Stream windows carry all the credit (the connection's window only follows what arrives). A stream may send its
initial window (``H2Limits.stream_window``) ahead of its call; a message larger than that gets the window it
still needs as a whole, reserved from the connection's ``connection_window`` (one message larger than that when
nothing else is reserved), and a stream that finds it taken waits until a call reads a message. A stream's
window is opened again as its call reads, not as bytes arrive. So what a connection can hold unread is its open
streams' initial windows and its reservations, and every reserved message can finish: credit given to one stream
cannot be spent on another.
"""

from __future__ import annotations

import asyncio

from ._frames import (
    _U32,
    CANCEL,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PROTOCOL_ERROR,
    WINDOW_UPDATE,
    _ConnectionError,
    frame,
)
from ._limits import Budget, H2Limits
from ._stream import H2Stream

CONNECTION_TOP_UP = 1 << 30
"""The connection's receive window is opened again once it is below this (it bounds nothing: streams do)."""


class Inflow:
    """What ``H2Connection`` keeps of the bytes it receives (a part of it, apart for its size)."""

    limits: H2Limits
    budget: Budget
    transport: asyncio.Transport | None
    streams: dict[int, H2Stream]
    _blocked: dict[int, H2Stream]
    recv_window: int
    """What the peer may still send on the connection."""
    held: int
    """Request bytes received and not yet read by the calls (nor let go)."""
    reserved: int
    """Window given to streams beyond their initial windows, for messages not yet read."""
    _waiting: dict[int, H2Stream]
    """Streams whose message needs more window than they have, and found it reserved by others."""
    _data_seen: bool
    loop: asyncio.AbstractEventLoop
    _calm: float
    """PINGs and SETTINGS since the last HEADERS or DATA either way, less one a second (``_calm_at``: when)."""
    _calm_at: float

    def _write(self, parts: list[bytes | memoryview]) -> None:
        raise NotImplementedError

    def reset_stream(self, stream: H2Stream, code: int = CANCEL) -> None:
        raise NotImplementedError

    def close(self, code: int = NO_ERROR, reason: str = "") -> None:
        raise NotImplementedError

    def _asked(self) -> None:
        """A PING or SETTINGS to answer: past ``max_pings_without_data`` of them beyond one a second, with no
        HEADERS or DATA between, the peer is asking for answers it does not need (a flood)."""
        now = self.loop.time()
        self._calm = max(0.0, self._calm - (now - self._calm_at)) + 1.0
        self._calm_at = now
        if self._calm > self.limits.max_pings_without_data:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many PINGs (or SETTINGS) without calls")

    def _unpad(self, flags: int, payload: memoryview) -> memoryview:
        if flags & PADDED:
            if not payload:
                raise _ConnectionError(PROTOCOL_ERROR, "padding without its length")
            pad = payload[0]
            if pad >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1 : len(payload) - pad]
        return payload

    def _data(self, flags: int, sid: int, payload: memoryview) -> None:
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < CONNECTION_TOP_UP:
            self._write([frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - self.recv_window))])
            self.recv_window = MAX_WINDOW
        self._data_seen = True
        stream = self.streams.get(sid)
        if stream is None or stream.ended:
            return  # a stream already answered or reset: its data is dropped
        if size > stream.recv_window:
            self.reset_stream(stream, FLOW_CONTROL_ERROR)
            return
        stream.recv_window -= size
        data = self._unpad(flags, payload) if flags & PADDED else payload
        kept = stream.held
        if data and stream.error is None:
            stream.received += len(data)
            stream._feed(data)
            kept = stream.held - kept
            if kept:
                self.held += kept
                self.budget.used += kept
        if flags & END_STREAM:
            stream.ended = True
        elif stream._buffer and stream.need() > stream.recv_window:
            self._extend(stream)
        if stream.messages or stream.ended or stream.error is not None:
            stream._wake()

    def _extend(self, stream: H2Stream) -> bool:
        """Give the stream the window its message still needs, if the connection's reservations and the budget
        allow; else it waits (False)."""
        more = stream.need() - stream.recv_window
        if more <= 0:
            return True
        if (self.reserved and self.reserved + more > self.limits.connection_window) or (
            self.budget.used + more > self.budget.limit
        ):
            self._waiting[stream.sid] = stream
            if self.budget.used + more > self.budget.limit:
                self.budget.waiting.add(self)
            return False
        self._waiting.pop(stream.sid, None)
        self.reserved += more
        stream.reserved += more
        stream.recv_window += more
        self._write([frame(WINDOW_UPDATE, 0, stream.sid, _U32.pack(more))])
        return True

    def extend_waiting(self) -> None:
        """Reservations (or the budget) freed: the streams that wait get their windows, oldest first."""
        for stream in list(self._waiting.values()):
            if stream.sid not in self.streams or not stream.need():
                self._waiting.pop(stream.sid, None)
            elif not self._extend(stream):
                return

    def consumed(self, stream: H2Stream, size: int) -> None:
        """A call read a message of ``size`` bytes (as they arrived): the stream may send as much again."""
        if stream.held < size:
            return  # the stream (or the connection) is over: what it held was let go then (``held`` 0)
        stream.held -= size
        self.held -= size
        self.budget.used -= size
        if stream.reserved:
            freed = min(stream.reserved, size)
            stream.reserved -= freed
            self.reserved -= freed
        if not stream.ended:
            window = self.limits.stream_window
            more = window - stream.held - stream.recv_window
            if more >= window >> 2:
                stream.recv_window += more
                self._write([frame(WINDOW_UPDATE, 0, stream.sid, _U32.pack(more))])
        if self._waiting or self.budget.waiting:
            self._freed()

    def _freed(self) -> None:
        if self._waiting:
            self.extend_waiting()
        if self.budget.waiting:
            self.budget.wake()

    def _forget(self, stream: H2Stream) -> None:
        """The stream is over: what it held unread and what was reserved for it are let go."""
        self.streams.pop(stream.sid, None)
        self._blocked.pop(stream.sid, None)
        if self._waiting:
            self._waiting.pop(stream.sid, None)
        if stream.reserved:
            self.reserved -= stream.reserved
            stream.reserved = 0
        if stream.held:
            self.held -= stream.held
            self.budget.used -= stream.held
            stream.held = 0
        if self._waiting or self.budget.waiting:
            self._freed()

    def _let_go(self) -> None:
        """The connection ends: what it held leaves the budget."""
        self.budget.used -= self.held
        self.held = 0
        for stream in self.streams.values():
            stream.held = 0
        self.budget.holders.discard(self)
        self.budget.waiting.discard(self)
        if self.budget.waiting:
            self.budget.wake()
