"""A small HTTP/1.1 server for the v2 endpoints, on httptools (the C parser uvicorn also uses).

``POST .../infer`` is answered by the InferEndpoint directly: one parse, one task and one write per
request, and a client that disconnects cancels its request, which leaves the model's queue unrun.
Every other request goes to an ASGI app (the Litestar app) through a small bridge that buffers the
response, which suits the control routes: small, never streamed.

HTTP/1.1 as clients use it: keep-alive (closed after ``keep_alive_s`` idle), pipelined requests
answered in order, ``Expect: 100-continue``, chunked request bodies, a body limit answered with 413,
and a drain on shutdown that lets every request already read finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from email.utils import formatdate
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

from ...protocol import HEADER_CONTENT_LENGTH, encode_error
from ._asgi import Answer, ASGIApp, AsgiBridge
from ._endpoint import InferEndpoint, infer_target

logger = logging.getLogger("modelsvc.http")

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
_JSON = b"application/json"
_HEADER_KEY = HEADER_CONTENT_LENGTH.encode()
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MAX_PIPELINED = 32
_MAX_HEAD_BYTES = 64 * 1024
"""The most a request line and its headers may take: more is answered 431 (nginx and uvicorn allow less)."""
_date_cache: list[object] = [0, b""]


def _date() -> bytes:
    """The ``Date`` header's value (IMF-fixdate, RFC 9110 5.6.7), made once a second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return cast(bytes, _date_cache[1])


def _response(
    status: int,
    body: bytes,
    content_type: bytes | None,
    headers: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = (),
    close: bool = False,
    keep_alive_header: bool = False,
    more: int = 0,
) -> bytes:
    """Status line, headers and body as one buffer, for one write; ``more``: bytes of body written after it."""
    parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode()]
    if content_type is not None:
        parts += [b"content-type: ", content_type, b"\r\n"]
    parts += [b"content-length: ", str(len(body) + more).encode(), b"\r\ndate: ", _date(), b"\r\n"]
    for key, value in headers:
        parts += [key, b": ", value, b"\r\n"]
    if close:
        parts.append(b"connection: close\r\n")
    elif keep_alive_header:
        parts.append(b"connection: keep-alive\r\n")
    parts += [b"\r\n", body]
    return b"".join(parts)


class _Request:
    __slots__ = ("body", "headers", "keep_alive", "method", "refused", "too_large", "url", "version")

    def __init__(
        self,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        too_large: bool,
        version: str,
        refused: tuple[int, str] | None = None,
    ) -> None:
        self.refused = refused
        """(status, message) for a request refused before its body (no Host, headers too large)."""
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.too_large = too_large
        self.version = version


class HttpServer:
    """Serves ``app`` (and, when given, the infer fast path) on one address."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        infer: InferEndpoint | None = None,
        max_body_size: int = 64 * 1024 * 1024,
        keep_alive_s: float = 75.0,
    ) -> None:
        self.app = app
        self._bridge = AsgiBridge(app)
        self.infer = infer
        self.max_body_size = max_body_size
        self.keep_alive_s = keep_alive_s
        self.connections: set[_Connection] = set()
        self.draining = False
        self.address: tuple[str, int] = ("", 0)
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on ``host:port``. ``reuse_port``: share the port with other processes (SO_REUSEPORT, Triton's
        ``--reuse-http-port``: the ingest workers)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop), host, port, backlog=4096, reuse_address=True, reuse_port=reuse_port or None
        )
        sockname = self._server.sockets[0].getsockname()
        self.address = (sockname[0], sockname[1])
        self._sweeper = loop.create_task(self._sweep_idle())

    async def start_unix(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (the engine's door for its ingest workers)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self, loop), path, backlog=4096)
        self.address = (path, 0)
        self._sweeper = loop.create_task(self._sweep_idle())

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting, let requests already read finish (up to ``grace_s``), close every connection."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            if conn.idle:
                conn.close()
        self.connection_idle()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), grace_s)
        for conn in list(self.connections):
            conn.abort()

    def connection_idle(self) -> None:
        """A connection finished its requests (or closed): while draining, see whether all are done."""
        if self.draining and all(c.idle for c in self.connections):
            self._drained.set()

    async def _sweep_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(5.0, self.keep_alive_s))
            cutoff = loop.time() - self.keep_alive_s
            for conn in list(self.connections):
                if conn.idle and conn.last_active < cutoff:
                    conn.close()

    async def respond(self, request: _Request, conn: _Connection) -> Answer:
        """The answer to one request: status, body, content type, headers and the body's tail."""
        if request.too_large:
            message = f"request body exceeds the limit of {self.max_body_size} bytes"
            return 413, encode_error(message), _JSON, (), ()
        if request.refused is not None:
            return request.refused[0], encode_error(request.refused[1]), _JSON, (), ()
        url = request.url
        if not url.startswith(b"/") and b"://" in url:  # absolute form (RFC 9112 3.2.2): the path is what counts
            url = b"/" + url.split(b"://", 1)[1].partition(b"/")[2]
        raw_path, _, query = url.partition(b"?")
        path = unquote(raw_path.decode("latin-1"))
        if self.infer is not None and request.method == b"POST":
            target = infer_target(path)
            if target is not None:
                reply = await self.infer.handle(target[0], target[1], request.headers, request.body, split=True)
                return reply.status, reply.body, reply.content_type, reply.headers, reply.tail
        return await self._bridge.answer(
            request.method,
            request.version,
            request.headers,
            request.body,
            path,
            raw_path,
            query,
            self.address,
            conn.peer,
            conn.lost,
        )


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order.

    Reading stops for good after a parser error or an oversized body; the requests already read are still
    answered, in order, and the connection closes after the last.
    """

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer: tuple[str, int] | None = None
        self.queue: deque[_Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.paused = False
        self.last_active = loop.time()
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost: asyncio.Future[None] | None = None
        #: no more requests will be read: after the queue, close (with this error answered first, if any)
        self._done_reading = False
        self._final_error: bytes | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._in_head = False  # between a request's first byte and the end of its headers
        self._head_bytes = 0

    @property
    def idle(self) -> bool:
        return self.task is None and not self.queue

    def lost(self) -> asyncio.Future[None]:
        """Resolves when the client disconnects (each caller gets its own, cancellable, future)."""
        if self._lost is None:
            self._lost = self.loop.create_future()
            if self.closed:
                self._lost.set_result(None)
        return asyncio.shield(self._lost)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping unsent data (a client that stopped reading)."""
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peer = transport.get_extra_info("peername")
        self.peer = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.queue.clear()
        self._writable.set()
        if self.task is not None:
            self.task.cancel()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        self.server.connection_idle()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def eof_received(self) -> bool:
        """The client closed its side. As uvicorn and nginx do, take it as gone: a FIN is all a full close
        shows at first, and a request whose client left must leave the queue. (A client that half-closes
        and still waits for its answer, such as ``nc -N``, therefore gets none.)"""
        return False

    def data_received(self, data: bytes) -> None:
        if self._done_reading:
            return
        self.last_active = self.loop.time()
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._refuse(431, f"the request line and headers exceed {_MAX_HEAD_BYTES} bytes")
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # The request asked to switch protocols (Upgrade, or CONNECT): it was answered as plain HTTP/1.1, as
            # RFC 9110 7.8 allows; what follows it on the connection is read as HTTP/1.1 again.
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            self.parser = httptools.HttpRequestParser(self)
            if offset < len(data):
                self.data_received(data[offset:])
        except httptools.HttpParserError as exc:
            after_close = "after" in str(exc).lower() and "close" in str(exc).lower()
            self._stop_reading(None if after_close else _error(400, f"malformed HTTP request: {exc}"))

    def _stop_reading(self, final_error: bytes | None) -> None:
        if self._done_reading:
            return
        self._done_reading = True
        self._final_error = final_error
        if self.transport is not None and not self.closed:
            with contextlib.suppress(RuntimeError):  # already paused, or closing
                self.transport.pause_reading()
        if self.idle:
            self._finish()

    def _finish(self) -> None:
        """Nothing left to answer and nothing more to read: say the last word and close."""
        if self.transport is None or self.closed:
            return
        if self._final_error is not None:
            self.transport.write(self._final_error)
            self._final_error = None
        self.transport.close()

    # -- httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        self._body = []
        self._size = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._done_reading:
            return
        expect_continue = False
        host = False
        for key, value in self._headers:
            if key == b"host":
                host = True
            elif key == b"content-length":
                with contextlib.suppress(ValueError):  # httptools rejects a bad content-length itself
                    if int(value) > self.server.max_body_size:
                        self._too_large = True
            elif key == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        if not host and self.parser.get_http_version() == "1.1":
            self._refuse(400, "an HTTP/1.1 request must carry a Host header")
        elif self._too_large:
            self._refuse_body()
        elif expect_continue and self.idle and self.transport is not None:
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._too_large or self._done_reading:
            return
        self._size += len(body)
        if self._size > self.server.max_body_size:
            self._too_large = True
            self._body = []
            self._refuse_body()
            return
        self._body.append(body)

    def _refuse_body(self) -> None:
        """The body is over the limit: answer 413 in turn, read nothing more."""
        self._enqueue(_Request(b"", self._url, self._headers, b"", False, True, self.parser.get_http_version()))
        self._stop_reading(None)

    def _refuse(self, status: int, message: str) -> None:
        """A request refused on its head: answer ``status`` in turn, read nothing more, then close."""
        self._in_head = False
        self._enqueue(_Request(b"", b"", [], b"", False, False, "1.1", (status, message)))
        self._stop_reading(None)

    def on_message_complete(self) -> None:
        if self._done_reading:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._enqueue(
            _Request(
                self.parser.get_method(),
                self._url,
                self._headers,
                body,
                self.parser.should_keep_alive(),
                False,
                self.parser.get_http_version(),
            )
        )

    def _enqueue(self, request: _Request) -> None:
        self.queue.append(request)
        if len(self.queue) > _MAX_PIPELINED and self.transport is not None and not self.paused:
            self.transport.pause_reading()
            self.paused = True
        if self.task is None:
            self._next()

    # -- answering --------------------------------------------------------------------------------
    def _next(self) -> None:
        if self.queue and not self.closed:
            self.task = self.loop.create_task(self._serve(self.queue.popleft()))
            if self.paused and len(self.queue) <= _MAX_PIPELINED // 2 and self.transport is not None:
                if not self._done_reading:
                    self.transport.resume_reading()
                self.paused = False
        else:
            self.task = None
            self.last_active = self.loop.time()
            if self._done_reading:
                self._finish()
            self.server.connection_idle()

    async def _serve(self, request: _Request) -> None:
        try:
            status, body, content_type, headers, tail = await self.server.respond(request, self)
        except asyncio.CancelledError:
            if not self.closed:  # cancelled by something other than the client leaving: give up on it
                self.task = None
                self.abort()
            return
        except Exception:  # pragma: no cover - respond() answers its own errors
            logger.exception("error answering a request")
            status, body, content_type, headers, tail = 500, encode_error("internal server error"), _JSON, (), ()
        if self.closed or self.transport is None:
            return
        # the last answer says close, unless a final error (a malformed request) still follows it and says so itself
        last = not self.queue and (self._done_reading or self.server.draining) and self._final_error is None
        close = not request.keep_alive or request.too_large or request.refused is not None or last
        keep_alive_header = request.version == "1.0"
        if request.method == b"HEAD":  # the head of the GET answer, with the length of the body it leaves out
            more = len(body) + sum(map(len, tail))
            self.transport.write(_response(status, b"", content_type, headers, close, keep_alive_header, more))
        elif tail:  # large outputs: one vectored write of the head and each output's bytes, no joined copy
            more = sum(map(len, tail))
            head = _response(status, body, content_type, headers, close, keep_alive_header, more)
            self.transport.writelines([head, *tail])
        else:
            self.transport.write(_response(status, body, content_type, headers, close, keep_alive_header))
        if close:  # nothing may follow an answer that says close, not even the final error
            self.queue.clear()
            self._done_reading = True
            self._final_error = None
            self.task = None
            self._finish()
            return
        if not self._writable.is_set():
            await self._writable.wait()  # the client is not reading: no more answers until it does
        self._next()


def _error(status: int, message: str) -> bytes:
    return _response(status, encode_error(message), _JSON, close=True)
