"""gRPC calls over ``h2``'s HTTP/2 streams: ``inference.GRPCInferenceService`` in the server's event loop.

Each stream's ``:path`` names a method of the service that tritonclient's generated modules describe; its request
message is parsed with the generated class, handed to the ``InferenceService`` method of that name with a
``CallContext`` (the part of ``grpc.aio.ServicerContext`` those methods use), and the answer goes back as one
message and the trailers (``grpc-status``, ``grpc-message``). What grpcio's server did around the handlers is done
here, with grpcio's codes and words:

- a path that names no method: UNIMPLEMENTED ``Method not found!``; a method the service does not offer (shared
  memory, trace and log settings): UNIMPLEMENTED ``Method not implemented!``;
- a message over the size limit either way: RESOURCE_EXHAUSTED ``Received message larger than max (N vs. M)`` /
  ``Sent message larger than max (N vs. M)``; a request that does not parse: INTERNAL;
- ``grpc-timeout``: past it the handler is cancelled and the call ends with DEADLINE_EXCEEDED;
- ``--grpc-restricted-protocol``: a call to a restricted category without its metadata gets UNAVAILABLE with the
  message of ``RestrictedApis.denied`` and never reaches its handler;
- a client that resets its stream (or goes away) cancels the handler, as grpcio cancels a call's task.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ...protocol import grpc_timeout_s
from .._restricted import GRPC_CATEGORIES, ApiCategory, RestrictedApis
from ._wire import SPLIT_FROM, RawInputsRequest, WireAnswer, split_raw_inputs
from .h2._connection import (
    CLOSE_AFTER_S,
    Budget,
    H2Connection,
    H2Limits,
    H2Stream,
    MessageError,
    StreamReset,
    literal,
)

logger = logging.getLogger("modelsvc.grpc")

SERVICE = "inference.GRPCInferenceService"
_OK_TRAILERS = literal(b"grpc-status", b"0")
_STATUS_BY_NAME = {code.name: code for code in grpc.StatusCode}


class Aborted(BaseException):
    """``CallContext.abort``: the call ends with this status (a BaseException, as nothing in a handler may
    take it for one of its own errors)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _percent(text: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, every byte outside printable ASCII (and ``%``) as ``%XX``."""
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def trailers(code: grpc.StatusCode, details: str) -> bytes:
    if code is grpc.StatusCode.OK and not details:
        return _OK_TRAILERS
    block = literal(b"grpc-status", str(code.value[0]).encode())
    return block + literal(b"grpc-message", _percent(details)) if details else block


def _metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """The call's custom metadata as grpcio gives it: names in lower case, ``-bin`` values decoded to bytes."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name.startswith((b":", b"grpc-")) or name in (b"te", b"content-type"):
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except (binascii.Error, ValueError):
                continue
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


class CallContext:
    """What ``InferenceService``'s methods use of ``grpc.aio.ServicerContext``."""

    __slots__ = ("_calls", "_metadata", "_stream")

    def __init__(self, calls: GrpcCalls, stream: H2Stream) -> None:
        self._calls = calls
        self._stream = stream
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            self._metadata = _metadata(self._stream.headers)
        return self._metadata

    def peer(self) -> str:
        transport = self._stream.conn.transport
        address = transport.get_extra_info("peername") if transport is not None else None
        return f"ipv4:{address[0]}:{address[1]}" if isinstance(address, tuple) else "unknown"

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise Aborted(code, details)

    async def write(self, message: Any) -> None:
        payload = message.SerializeToString()
        self._calls.check_size(len(payload))
        self._stream.send(payload, None)
        if self._stream.blocked:
            await self._stream.drain()


@dataclass(frozen=True)
class Method:
    name: str
    request: Any  # the generated message class
    handler: Callable[..., Any]
    streaming: bool  # client streaming (ModelStreamInfer); every method answers one message or a stream of them
    category: ApiCategory | None


class GrpcCalls:
    """The ``CallHandler`` of every connection: routes streams to the service's methods."""

    def __init__(self, service: Any, max_message_size: int, restricted: RestrictedApis | None) -> None:
        self.max_message_size = max_message_size
        self.restricted = restricted
        self.methods: dict[bytes, Method] = {}
        base = service_pb2_grpc.GRPCInferenceServiceServicer
        for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            if getattr(type(service), m.name) is getattr(base, m.name, None):
                continue  # not offered: "Method not implemented!"
            self.methods[f"/{SERVICE}/{m.name}".encode()] = Method(
                m.name,
                getattr(service_pb2, m.input_type.name),
                getattr(service, m.name),
                m.client_streaming,
                GRPC_CATEGORIES.get(m.name),
            )
        self._known = {f"/{SERVICE}/{m.name}".encode() for m in service_pb2.DESCRIPTOR.services_by_name[
            "GRPCInferenceService"
        ].methods}  # fmt: skip
        self.tasks: set[asyncio.Task[None]] = set()

    def check_size(self, size: int) -> None:
        if size > self.max_message_size:
            raise Aborted(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({size} vs. {self.max_message_size})",
            )

    @staticmethod
    def _parse(method: Method, message: bytes) -> Any:
        if method.name == "ModelInfer" and len(message) >= SPLIT_FROM:  # large tensors: not copied
            rest, raws = split_raw_inputs(message)
            if raws:
                return RawInputsRequest(method.request.FromString(rest), raws)
        return method.request.FromString(message)

    def open(self, stream: H2Stream) -> None:
        task = stream.conn.loop.create_task(self._run(stream))
        stream.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, stream: H2Stream) -> None:
        path = b""
        deadline: asyncio.TimerHandle | None = None
        expired = False
        for name, value in stream.headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = grpc_timeout_s(value)  # one it cannot read is ignored, as grpc core does
                if timeout is not None:

                    def expire() -> None:
                        nonlocal expired
                        expired = True
                        if stream.task is not None:
                            stream.task.cancel()

                    deadline = stream.conn.loop.call_later(timeout, expire)
        try:
            code, details, payload = await self._call(stream, path)
        except asyncio.CancelledError:
            if not expired:
                stream.conn.reset_stream(stream)
                raise
            code, details, payload = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", None
        except StreamReset:
            return
        finally:
            if deadline is not None:
                deadline.cancel()
        stream.send(payload, trailers(code, details))

    async def _call(self, stream: H2Stream, path: bytes) -> tuple[grpc.StatusCode, str, bytes | WireAnswer | None]:
        method = self.methods.get(path)
        if method is None:
            if path in self._known:
                return grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!", None
            return grpc.StatusCode.UNIMPLEMENTED, "Method not found!", None
        context = CallContext(self, stream)
        try:
            restricted = self.restricted
            if method.category is not None and restricted is not None and restricted.restricts(method.category):
                denied = restricted.denied(method.category, stream.headers)
                if denied is not None:
                    return grpc.StatusCode.UNAVAILABLE, denied, None
            if method.streaming:
                await method.handler(self._requests(stream, method), context)
                return grpc.StatusCode.OK, "", None
            message = await stream.read()
            if message is None:
                return grpc.StatusCode.INTERNAL, "Missing request message", None
            try:
                request = self._parse(method, message)
            except Exception:
                return grpc.StatusCode.INTERNAL, "Exception deserializing request!", None
            answer = await method.handler(request, context)
            if isinstance(answer, WireAnswer):
                self.check_size(answer.size)
                return grpc.StatusCode.OK, "", answer
            payload: bytes = answer.SerializeToString()
            self.check_size(len(payload))
            return grpc.StatusCode.OK, "", payload
        except Aborted as exc:
            return exc.code, exc.details, None
        except MessageError as exc:
            return _STATUS_BY_NAME[exc.status], exc.text, None
        except (StreamReset, asyncio.CancelledError):
            raise
        except Exception:
            logger.exception("unexpected error in gRPC method %s", method.name)
            return grpc.StatusCode.UNKNOWN, "Unexpected error in RPC handling", None

    async def _requests(self, stream: H2Stream, method: Method) -> AsyncIterator[Any]:
        while (message := await stream.read()) is not None:
            try:
                yield method.request.FromString(message)
            except Exception:
                raise Aborted(grpc.StatusCode.INTERNAL, "Exception deserializing request!") from None


class H2GrpcServer:
    """Listens, makes an ``H2Connection`` per client, and drains or stops them all. ``limits``: the bounds of each
    connection; their ``buffer_budget`` is shared by all of them (at least one largest message and a connection
    window, so that a message the size limit allows can always arrive)."""

    def __init__(self, calls: GrpcCalls, limits: H2Limits | None = None) -> None:
        self.calls = calls
        self.limits = limits = limits or H2Limits()
        self.budget = Budget(max(limits.buffer_budget, calls.max_message_size + limits.connection_window))
        self.connections: set[H2Connection] = set()
        self._none_left = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen; the port bound (OSError when that fails). ``reuse_port``: SO_REUSEPORT (the ingest workers)."""
        loop = asyncio.get_running_loop()
        bind_host = host.strip("[]") if host.startswith("[") else host
        self._server = await loop.create_server(
            self._connection, bind_host or None, port, reuse_port=reuse_port or None
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str) -> int:
        """Listen on the Unix socket ``path``; 0 for the port."""
        self._server = await asyncio.get_running_loop().create_unix_server(self._connection, path)
        return 0

    def _connection(self) -> H2Connection:
        conn = H2Connection(self.calls, self.calls.max_message_size, self._closed, self.limits, self.budget)
        self.connections.add(conn)
        return conn

    def _closed(self, conn: H2Connection) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._none_left.set()

    async def shutdown(self, grace_s: float) -> None:
        """No new connections or calls; those in flight get up to ``grace_s`` to finish, then are cancelled."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.go_away()
        waits = [asyncio.ensure_future(conn.idle.wait()) for conn in list(self.connections)]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace_s)
            for w in pending:
                w.cancel()
        # clients close the connections they were told to leave (closing them here first could reset them
        # before the last answers were read); whatever is still open after a moment is closed
        if self.connections:
            self._none_left.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_left.wait(), CLOSE_AFTER_S)
        self.stop_now()
        if self.calls.tasks:
            await asyncio.wait(set(self.calls.tasks), timeout=1.0)

    def stop_now(self) -> None:
        """Cancel every call and close every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self.calls.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.close()
