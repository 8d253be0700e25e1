"""The receiving side of ``_connection``'s flow control: the windows a peer gets, opened again as calls read
their messages, one message at a time let past a spent connection window, and the process-wide ``Budget``."""

from __future__ import annotations

import asyncio

from ._frames import _U32, CANCEL, END_STREAM, FLOW_CONTROL_ERROR, NO_ERROR, WINDOW_UPDATE, frame
from ._limits import Budget, H2Limits
from ._stream import H2Stream

GRANT_BELOW = 1 << 16
"""A connection window below this, with a message that cannot finish in it: the message gets what it needs."""


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
    _granted: H2Stream | None
    """The stream whose message was let past the connection's window; ``_grant``: by how much; ``_grant_until``:
    the stream's ``received`` once that message is in."""
    _grant: int
    _grant_until: int
    _data_seen: bool

    def _write(self, parts: list[bytes | memoryview]) -> None:
        raise NotImplementedError

    def _unpad(self, flags: int, payload: memoryview) -> memoryview:
        raise NotImplementedError

    def reset_stream(self, stream: H2Stream, code: int = CANCEL) -> None:
        raise NotImplementedError

    def close(self, code: int = NO_ERROR, reason: str = "") -> None:
        raise NotImplementedError

    def _data(self, flags: int, sid: int, payload: memoryview) -> None:
        size = len(payload)
        self.recv_window -= size
        self._data_seen = True
        stream = self.streams.get(sid)
        if stream is None or stream.ended:
            self._top_up()  # a stream already answered or reset: its data is dropped, and taken as read
            return
        if size > stream.recv_window:
            self.reset_stream(stream, FLOW_CONTROL_ERROR)
            self._top_up()
            return
        stream.recv_window -= size
        data = self._unpad(flags, payload)
        kept = stream.held
        if data and stream.error is None:
            stream.received += len(data)
            stream._feed(data)
        kept = stream.held - kept
        if kept:
            self.held += kept
            self.budget.used += kept
        if kept != size:  # padding, a message refused: taken as read
            self._top_up()
        if flags & END_STREAM:
            stream.ended = True
        elif stream._buffer:
            need = stream.need()
            if need > stream.recv_window:  # a message larger than the stream's window: the window it needs
                self._write([frame(WINDOW_UPDATE, 0, sid, _U32.pack(need - stream.recv_window))])
                stream.recv_window = need
        if stream is self._granted and (stream.received >= self._grant_until or not stream.need()):
            self._granted, self._grant = None, 0
        if stream.messages or stream.ended or stream.error is not None:
            stream._wake()

    def consumed(self, stream: H2Stream, size: int) -> None:
        """A call read a message of ``size`` bytes (as they arrived): the peer may send as much again."""
        if self.streams.get(stream.sid) is not stream or stream.held < size:
            return  # the stream (or the connection) is over: what it held was let go then
        stream.held -= size
        self.held -= size
        self.budget.used -= size
        if not stream.ended and stream.sid in self.streams:
            window = self.limits.stream_window
            more = window - stream.held - stream.recv_window
            if more >= window >> 2:
                stream.recv_window += more
                self._write([frame(WINDOW_UPDATE, 0, stream.sid, _U32.pack(more))])
        self._top_up()

    def _top_up(self) -> None:
        """Open the connection's window again by what was read since, once that is worth a frame."""
        window = self.limits.connection_window
        more = window + self._grant - self.held - self.recv_window
        if more >= window >> 2 or (more > 0 and self.recv_window < GRANT_BELOW):
            self.recv_window += more
            self._write([frame(WINDOW_UPDATE, 0, 0, _U32.pack(more))])

    def _grant_one(self) -> None:
        """The connection's window is spent: if a message that has begun cannot finish in what is left, let the
        oldest such one finish (within the budget), so that partial messages never hold the window for good."""
        if not self.held:
            return
        for stream in self.streams.values():
            need = stream.need()
            if need > 0:
                break
        else:
            return
        grant = need - self.recv_window
        if grant <= 0 or self.budget.used + grant > self.budget.limit:
            return
        self._granted, self._grant, self._grant_until = stream, grant, stream.received + need
        self.recv_window += grant
        self._write([frame(WINDOW_UPDATE, 0, 0, _U32.pack(grant))])

    def _forget(self, stream: H2Stream) -> None:
        """The stream is over: what it held unread is let go."""
        self.streams.pop(stream.sid, None)
        self._blocked.pop(stream.sid, None)
        if stream is self._granted:
            self._granted, self._grant = None, 0
        if stream.held:
            self.held -= stream.held
            self.budget.used -= stream.held
            stream.held = 0
            self._top_up()

    def _let_go(self) -> None:
        """The connection ends: what it held leaves the budget."""
        self.budget.used -= self.held
        self.held = 0
        for stream in self.streams.values():
            stream.held = 0
        self.budget.holders.discard(self)
