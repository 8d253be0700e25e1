"""What a worker passes to the engine whole: every call but inference, to the engine's own doors on Unix sockets.

Health, metadata, configs, statistics, the repository index, model control, and gRPC streams (sequence and decoupled
models) are answered by the engine's HTTP and gRPC doors, listening on sockets only the workers can reach; a worker
forwards the request and returns the answer unchanged. So everything a client observes besides an inference's
protocol work comes from one place, with the same statuses, errors and bodies as one process gives.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio
import httpx
from tritonclient.grpc import service_pb2_grpc

from ..grpc._service import InferenceService
from ..http._asgi import ASGIApp

_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"upgrade", b"te"}


def http_proxy(socket_path: str) -> ASGIApp:
    """An ASGI app that asks the engine's HTTP door (on ``socket_path``) and answers what it answered."""
    # no cap on connections (httpx's default is 100): slow calls (model loads) must not hold up a health check
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket_path, limits=limits), timeout=None)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        query = scope.get("query_string") or b""
        url = "http://engine" + scope["raw_path"].decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        try:
            answer = await client.request(scope["method"], url, headers=headers, content=b"".join(chunks))
        except httpx.TransportError:
            body = b'{"error":"the model service\'s engine process is not answering"}'
            start = {"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]}
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        out = [(k, v) for k, v in answer.headers.raw if k.lower() not in _HOP and k.lower() != b"date"]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": answer.content})

    app.client = client  # type: ignore[attr-defined]
    return app


#: the unary methods a worker forwards to the engine's gRPC door (ModelInfer it serves itself)
FORWARDED = (
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
)


def _metadata(context: Any) -> tuple[tuple[str, str | bytes], ...]:
    pairs = context.invocation_metadata() or ()
    return tuple((k, v) for k, v in pairs if not k.startswith(":") and k != "grpc-timeout")


class ProxyService(InferenceService):
    """The gRPC service in a worker: ``ModelInfer`` through the remote data plane, the rest forwarded."""

    def __init__(self, dataplane: Any, target: str, max_message_size: int) -> None:
        super().__init__(dataplane)
        self._target = target
        self._max = max_message_size
        self._stub_: Any = None
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> Any:
        if self._stub_ is None:
            self._channel = grpc.aio.insecure_channel(
                self._target,
                options=[
                    ("grpc.max_send_message_length", self._max),
                    ("grpc.max_receive_message_length", self._max),
                ],
            )
            self._stub_ = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub_

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> None:
        """The whole stream, to the engine's door and back: its requests in order, its responses as they come."""
        call = self._stub().ModelStreamInfer(metadata=_metadata(context), timeout=_remaining(context))

        async def pump() -> None:
            async for message in request_iterator:
                await call.write(message)
            await call.done_writing()

        writer = asyncio.ensure_future(pump())
        try:
            async for response in call:
                await context.write(response)
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await writer
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            writer.cancel()
            call.cancel()


def _remaining(context: Any) -> float | None:
    remaining = getattr(context, "time_remaining", None)
    return remaining() if callable(remaining) else None


def _forward(name: str) -> Any:
    async def method(self: ProxyService, request: Any, context: Any) -> Any:
        try:
            return await getattr(self._stub(), name)(request, metadata=_metadata(context))
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")

    method.__name__ = name
    return method


for _name in FORWARDED:
    setattr(ProxyService, _name, _forward(_name))
