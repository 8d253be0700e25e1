"""What a peer may make this process hold: the bounds of one connection (``H2Limits``) and the process-wide budget of
buffered request bytes (``Budget``), against which ``_connection`` checks every stream and DATA frame.

The names follow grpc core's channel arguments where it has one (``grpc.max_concurrent_streams``,
``grpc.max_metadata_size``); grpc core bounds a process's memory with a resource quota, closing the connections
that hold the most when it runs short, which is what ``Budget.reclaim`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class H2Limits:
    """The bounds of each connection of the h2 engine (``--grpc-*`` flags of ``modelsvc serve``)."""

    max_concurrent_streams: int = 100
    """SETTINGS_MAX_CONCURRENT_STREAMS, advertised and enforced: a stream beyond it is refused (REFUSED_STREAM).
    grpc core's ``grpc.max_concurrent_streams`` (unbounded by default; grpc clients queue calls beyond it)."""
    stream_window: int = 1 << 16
    """SETTINGS_INITIAL_WINDOW_SIZE: what a stream may send ahead of its call reading it (grpc core starts at
    64 KiB too); a message up to this size goes without waiting for the server."""
    connection_window: int = 4 << 20
    """Window one connection's streams may be given beyond their initial windows, for the messages larger than
    those, until their calls read them (a message gets all it still needs at once, or waits; one larger than this
    may have it when nothing else does). With ``max_concurrent_streams`` x ``stream_window`` it bounds what a
    connection can make the server hold (10.4 MiB by default, or one largest message more)."""
    max_metadata_size: int = 64 << 10
    """Largest header block, compressed, as it arrives (HEADERS and its CONTINUATION frames together), and
    SETTINGS_MAX_HEADER_LIST_SIZE: a larger one closes the connection (ENHANCE_YOUR_CALM) before it is kept."""
    buffer_budget: int = 256 << 20
    """Request bytes all connections of the process may hold unread together: while they are all taken new streams
    are refused (RESOURCE_EXHAUSTED), and past it the connections that hold the most are closed
    (ENHANCE_YOUR_CALM)."""
    write_buffer: int = 1 << 20
    """Bytes queued for a peer past which this side stops reading that connection (until they drain to a
    quarter): a peer that does not read what it asked for (PING, SETTINGS) cannot make the server buffer more."""
    max_pings_without_data: int = 100
    """PINGs (and SETTINGS) a peer may send beyond one a second with no HEADERS or DATA between (either way); one
    more and the connection gets GOAWAY ENHANCE_YOUR_CALM. (grpc core's server is stricter: two PINGs within 5
    minutes without calls, ``grpc.http2.max_ping_strikes`` and ``grpc.http2.min_ping_interval_without_data_ms``.)"""
    max_reset_streams: int = 1000
    """How many more streams a peer may reset than this side completed (CVE-2023-44487, rapid reset); one more
    and the connection gets GOAWAY ENHANCE_YOUR_CALM."""

    def __post_init__(self) -> None:
        for name in ("max_concurrent_streams", "max_metadata_size", "buffer_budget", "write_buffer",
                     "max_pings_without_data"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 65535 <= self.stream_window <= 2**31 - 1:  # (a peer may send 65535 before it reads the settings)
            raise ValueError("stream_window must be between 65535 and 2^31-1 bytes")
        if not 1024 <= self.connection_window <= 2**31 - 1:
            raise ValueError("connection_window must be between 1024 and 2^31-1 bytes")
        if self.max_reset_streams < 0:
            raise ValueError("max_reset_streams must be at least 0")


class Holder(Protocol):
    """A connection, as the budget sees it."""

    held: int

    def close(self, code: int = ..., reason: str = ...) -> None: ...

    def extend_waiting(self) -> None: ...


class Budget:
    """Request bytes held unread by all connections (each adds and takes back its own ``held``)."""

    __slots__ = ("holders", "limit", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.holders: set[Holder] = set()
        self.waiting: set[Holder] = set()  # connections with a stream waiting for the budget to have room

    def wake(self) -> None:
        """Room again: the connections that wait for it give their streams the windows they need."""
        if self.used < self.limit:
            for holder in list(self.waiting):
                self.waiting.discard(holder)
                holder.extend_waiting()

    def reclaim(self, code: int) -> None:
        """Over the budget: close the connections that hold the most until it is kept (each gives its bytes back
        as it closes)."""
        while self.used > self.limit and self.holders:
            biggest = max(self.holders, key=lambda h: h.held)
            if biggest.held <= 0:
                return
            biggest.close(code, f"holds {biggest.held} request bytes with the process over its budget of {self.limit}")
            self.holders.discard(biggest)
