"""Sending one request and naming its failure: raw HTTP/1.1 keep-alive connections and a gRPC channel.

A transport's ``request(payload)`` returns None on success or the kind of error: ``http 404``,
``grpc NOT_FOUND``, ``connection error``, ``timeout``, ``protocol error``. The HTTP side writes prebuilt
requests on plain asyncio connections and parses answers with httptools (already a dependency of the
server): httpx costs several times more CPU per request, and on 2 shared cores the generator's own CPU
is what bounds a load test of a fast model.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any, Protocol, cast

import httptools

from loadtests.loadgen._inputs import Target, http_request
from loadtests.loadgen._stats import ServerCounters

CONNECTION_ERROR = "connection error"
TIMEOUT = "timeout"
PROTOCOL_ERROR = "protocol error"


class Transport(Protocol):
    async def request(self, payload: Any) -> str | None: ...

    async def close(self) -> None: ...


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self._body: list[bytes] = []
        self._framed = False  # the answer has a Content-Length or is chunked
        self._headers_done = False
        self.answered = False  # some bytes of the current answer arrived
        self.usable = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        if self._headers_done and not self._framed:
            # a close-delimited answer (no Content-Length, not chunked): the end of the stream ends its body
            self.on_message_complete()
        self._fail(ConnectionResetError("connection closed by the server"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:  # httptools passes whole names and values
        key = name.lower()
        if key == b"content-length" or (key == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._headers_done = False
        if not self._parser.should_keep_alive():
            self.usable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(self._parser.get_status_code())

    def _fail(self, exc: BaseException) -> None:
        self.usable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self._transport is not None:
            self._transport.close()

    async def send(self, data: bytes, timeout: float) -> tuple[int, bytes]:
        """Write one request and wait for its answer: (status, body)."""
        assert self._transport is not None
        self._framed = self._headers_done = self.answered = False
        if not self.usable or self._transport.is_closing():
            raise ConnectionResetError("connection closed by the server")
        self._waiter = waiter = self._loop.create_future()
        self._body = []
        try:
            self._transport.write(data)
        except RuntimeError as exc:  # uvloop: the handle closed under us
            self.usable = False
            raise ConnectionResetError(str(exc)) from exc
        timer = self._loop.call_later(timeout, self._fail, TimeoutError())
        try:
            status = await waiter
        finally:
            timer.cancel()
        return status, b"".join(self._body)

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self._transport.close()


class HttpTransport:
    """A pool of keep-alive connections to one host: an idle one is reused, else a new one is opened."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: deque[_Connection] = deque()
        self._all: set[_Connection] = set()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(loop), self.host, self.port), self.timeout
        )
        self._all.add(conn)
        return conn

    def _pooled(self) -> _Connection | None:
        """An idle connection that is still open (the server may have closed some while they were idle)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            self._drop(conn)
        return None

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def exchange(self, data: bytes) -> tuple[int, bytes]:
        """Send a prebuilt request; raises OSError (connection) or TimeoutError.

        A pooled connection that turns out to be dead before any byte of the answer arrived (the server closed
        it while idle, and the close crossed our write) is replaced by a fresh one and the request sent once
        more, as HTTP clients do when they reuse a connection."""
        conn = self._pooled()
        if conn is not None:
            try:
                return await self._exchange_on(conn, data)
            except TimeoutError:
                raise
            except OSError:
                if conn.answered:
                    raise
        return await self._exchange_on(await self._connect(), data)

    async def _exchange_on(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        try:
            answer = await conn.send(data, self.timeout)
        except BaseException:
            self._drop(conn)
            raise
        if conn.usable:
            self._idle.append(conn)
        else:
            self._drop(conn)
        return answer

    async def request(self, payload: bytes) -> str | None:
        try:
            status, _ = await self.exchange(payload)
        except TimeoutError:
            return TIMEOUT
        except httptools.HttpParserError:
            return PROTOCOL_ERROR
        except OSError:
            return CONNECTION_ERROR
        return None if 200 <= status < 300 else f"http {status}"

    async def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


#: what grpc's UNAVAILABLE details say when the channel could not reach the server or lost it (a server that
#: answers UNAVAILABLE itself, e.g. for a model that is not ready, says something else)
_CONNECTION_FAILURES = ("failed to connect", "connection refused", "connection reset", "socket closed",
                        "broken pipe", "connection closed", "connect failed")  # fmt: skip


def _is_connection_failure(details: str) -> bool:
    lowered = details.lower()
    return any(words in lowered for words in _CONNECTION_FAILURES)


class GrpcTransport:
    """One grpc.aio channel (HTTP/2 multiplexes the concurrent calls) and the v2 service stub."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self._grpc = grpc
        self.timeout = timeout
        self.channel = grpc.aio.insecure_channel(
            f"{host}:{port}",
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def request(self, payload: Any) -> str | None:
        try:
            await self.stub.ModelInfer(payload, timeout=self.timeout)
        except self._grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                return TIMEOUT
            if code == self._grpc.StatusCode.UNAVAILABLE and _is_connection_failure(exc.details() or ""):
                return CONNECTION_ERROR
            return f"grpc {code.name}"
        return None

    async def close(self) -> None:
        await self.channel.close()


def open_transport(target: Target, timeout: float) -> Transport:
    host, port = target.host_port
    if target.protocol == "grpc":
        return GrpcTransport(host, port, timeout)
    return HttpTransport(host, port, timeout)


# ---------------------------------------------------------------------------------------------------------
# statistics


class StatsReader:
    """Reads the model's cumulative counters (Triton's statistics) over HTTP or gRPC; None when unavailable."""

    def __init__(self, target: Target, transport: Transport, timeout: float = 5.0) -> None:
        self.target = target
        self._grpc: GrpcTransport | None = None
        self._http: HttpTransport | None = None
        self._request = b""
        self.problem = ""  # why the last read returned None when it tried and failed
        if target.protocol == "grpc" and not target.stats_url:
            assert isinstance(transport, GrpcTransport)
            self._grpc = transport
        elif target.stats_url or target.protocol == "http":
            stats_target = Target(target.stats_url or target.url, target.model, target.model_version)
            host, port = stats_target.host_port
            self._http = HttpTransport(host, port, timeout)
            self._request = http_request("GET", host, port, f"{stats_target.model_path}/stats", b"", {})

    async def read(self) -> ServerCounters | None:
        """The counters now, or None when they cannot be read (``problem`` then says why); never raises."""
        self.problem = ""
        if not self.target.model:
            return None
        try:
            return await self._read()
        except Exception as exc:  # a statistics read must never end a measurement
            self.problem = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
            return None

    async def _read(self) -> ServerCounters | None:
        if self._grpc is not None:
            from google.protobuf import json_format
            from tritonclient.grpc import service_pb2

            ask = service_pb2.ModelStatisticsRequest(name=self.target.model, version=self.target.model_version)
            try:
                answer = await self._grpc.stub.ModelStatistics(ask, timeout=5.0)
            except self._grpc._grpc.aio.AioRpcError as exc:
                self.problem = f"grpc {exc.code().name}: {exc.details()}"
                return None
            return ServerCounters.from_stats_json(json_format.MessageToDict(answer, preserving_proto_field_name=True))
        if self._http is not None:
            status, body = await self._http.exchange(self._request)
            if status != 200:
                self.problem = f"http {status}"
                return None
            return ServerCounters.from_stats_json(json.loads(body))
        return None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
