"""The gRPC transport of the v2 protocol: ``inference.GRPCInferenceService`` over the data plane.

The service is the one tritonclient's generated stubs describe (``tritonclient.grpc.service_pb2_grpc``), served
by grpcio's asyncio server in the event loop the HTTP server runs in. Like the HTTP transport it only decodes,
calls the data plane and encodes; inference, validation and statistics live in ``DataPlane``.

Errors travel as gRPC status codes with Triton's meaning (``_status.GRPC_STATUS``); an unexpected error is
INTERNAL with a fixed message and its detail goes to the log. Messages larger than ``max_message_size`` (either
way) are refused by grpcio itself with RESOURCE_EXHAUSTED.

``ModelStreamInfer`` works as Triton's does (``_stream``): the requests of one stream run concurrently (up to
``STREAM_WINDOW`` at a time); a model that is not decoupled gives each exactly one ``ModelStreamInferResponse``,
marked with the parameter ``triton_final_response: true``, in the order the requests came (a slow request holds
back the answers after it, as in Triton); a decoupled model's responses go out as it sends them. A request that
fails gets its answer with ``error_message`` set and only its id, model name and version in ``infer_response``;
the stream goes on. ``ModelInfer`` on a decoupled model answers UNIMPLEMENTED, as in Triton. When the server
drains, a stream stops reading, answers what it has read, and ends with UNAVAILABLE if the client had not closed
its side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ...engine import DataPlane
from ...protocol import (
    InferResponse,
)
from .._restricted import RestrictedApis, RestrictionInterceptor
from ._calls import GrpcCalls, H2GrpcServer
from ._codec import _wire, decode_infer_request, encode_infer_response
from ._status import Context, _abort, _code, _end_trace, grpc_status
from ._stream import serve_stream
from .h2._limits import H2Limits

logger = logging.getLogger("modelsvc.grpc")

T = TypeVar("T")

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message taken or sent: the same as the HTTP body limit. (Triton's gRPC allows 2 GiB and has no flag.)"""


def _tensor_metadata(entries: Sequence[dict[str, Any]]) -> list[Any]:
    return [
        service_pb2.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in entries
    ]


def _trace_headers(context: Context) -> list[tuple[bytes, bytes]]:
    """The call's text metadata as the (lower-case name, value) pairs the tracer reads ``traceparent`` from."""
    return [
        (key.encode("latin-1"), value.encode("latin-1"))
        for key, value in context.invocation_metadata() or ()
        if isinstance(value, str)
    ]


# -- the service ----------------------------------------------------------------------------------------------


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``inference.GRPCInferenceService`` over one data plane. Shared memory, trace and log settings are not
    offered: they answer UNIMPLEMENTED (the generated base's default)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.draining = False
        self._encode: Callable[[InferResponse], Any] = encode_infer_response
        """How ModelInfer's answer is encoded: the message (grpcio serializes it), or ``WireAnswer`` pieces
        (the h2 engine writes the outputs from their arrays)."""
        self._stream_readers: set[asyncio.Task[None]] = set()

    def drain(self) -> None:
        """Shutdown began: open streams stop reading, answer what they have read, and end."""
        self.draining = True
        for reader in list(self._stream_readers):
            reader.cancel()

    @staticmethod
    async def _answer(context: Context, make: Callable[[], T]) -> T:
        try:
            return make()
        except Exception as exc:
            await _abort(context, exc)

    # -- health and metadata ----------------------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Context) -> Any:
        return service_pb2.ServerLiveResponse(live=self.dataplane.live())

    async def ServerReady(self, request: Any, context: Context) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.dataplane.ready())

    async def ModelReady(self, request: Any, context: Context) -> Any:
        return service_pb2.ModelReadyResponse(ready=self.dataplane.model_ready(request.name, request.version or None))

    async def ServerMetadata(self, request: Any, context: Context) -> Any:
        meta = self.dataplane.server_metadata()
        return service_pb2.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    async def ModelMetadata(self, request: Any, context: Context) -> Any:
        meta = await self._answer(context, lambda: self.dataplane.model_metadata(request.name, request.version or None))
        return service_pb2.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=_tensor_metadata(meta["inputs"]),
            outputs=_tensor_metadata(meta["outputs"]),
        )

    async def ModelConfig(self, request: Any, context: Context) -> Any:
        # the JSON /config serves, read back into the proto: both transports answer from one place
        config = await self._answer(context, lambda: self.dataplane.model_config(request.name, request.version or None))
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        stats = await self._answer(context, lambda: self.dataplane.statistics(request.name, request.version or None))
        return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        rows = self.dataplane.repository_index(request.ready)
        return service_pb2.RepositoryIndexResponse(
            models=[
                service_pb2.RepositoryIndexResponse.ModelIndex(
                    name=r["name"], version=r.get("version", ""), state=r.get("state", ""), reason=r.get("reason", "")
                )
                for r in rows
            ]
        )

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            if key == "config":
                config = param.string_param
            elif key.startswith("file:"):
                files[key[len("file:") :]] = param.bytes_param
        try:
            await self.dataplane.load_model(request.model_name, config, files or None)
        except Exception as exc:
            await _abort(context, exc)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        flag = request.parameters.get("unload_dependents")
        try:
            await self.dataplane.unload_model(request.model_name, bool(flag is not None and flag.bool_param))
        except Exception as exc:
            await _abort(context, exc)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- inference --------------------------------------------------------------------------------------------
    async def _infer(
        self,
        message: Any,
        headers: Sequence[tuple[bytes, bytes]],
        encode: Callable[[InferResponse], Any],
        endpoint: str | None = None,
    ) -> Any:
        """One request through the data plane, with its trace when tracing is on; errors propagate. ``endpoint``:
        how a refusal of a decoupled model names the call."""
        model = message.model_name
        version = message.model_version or None
        tracing = self.dataplane.tracing
        trace = None if tracing is None else tracing.start(model, version, headers)
        if trace is None:
            return encode(await self.dataplane.infer(model, version, decode_infer_request(message), endpoint=endpoint))
        try:
            request = decode_infer_request(message)
            trace.request(request.id)
            answer = encode(await self.dataplane.infer(model, version, request, trace, endpoint=endpoint))
        except Exception as exc:
            _end_trace(trace, exc, _code(exc))
            raise
        except BaseException as exc:
            _end_trace(trace, exc, grpc.StatusCode.CANCELLED)
            raise
        _end_trace(trace, None, grpc.StatusCode.OK)
        return answer

    async def ModelInfer(self, request: Any, context: Context) -> Any:
        headers = _trace_headers(context) if self.dataplane.tracing is not None else ()
        try:
            return await self._infer(request, headers, self._encode, "ModelInfer RPC")
        except Exception as exc:
            await _abort(context, exc)

    async def ModelStreamInfer(self, request_iterator: Any, context: Context) -> None:
        """Answer every request of the stream (``_stream``): one answer each, in order, for models that are not
        decoupled; each response as it is sent for decoupled models."""
        headers = _trace_headers(context) if self.dataplane.tracing is not None else ()
        await serve_stream(self, request_iterator, context, headers)

    async def _stream_answer(self, message: Any, headers: Sequence[tuple[bytes, bytes]]) -> Any:
        """The one answer to a stream's request, marked ``triton_final_response`` as Triton marks it."""
        error = ""
        try:
            answer = await self._infer(message, headers, encode_infer_response)
        except Exception as exc:
            _, error = grpc_status(exc)
            answer = service_pb2.ModelInferResponse(
                id=message.id, model_name=message.model_name, model_version=message.model_version
            )
        answer.parameters["triton_final_response"].bool_param = True
        return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=answer)


# -- the server -----------------------------------------------------------------------------------------------


class GrpcServer:
    """The gRPC endpoint: ``start``, then ``shutdown`` (drain) or ``stop_now``.

    ``engine``: ``"h2"`` (the default) serves HTTP/2 itself in the event loop (``h2``, ``_calls``);
    ``"grpcio"`` runs grpcio's asyncio server instead (the same service, about half the throughput here).
    """

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_BYTES,
        restricted: RestrictedApis | None = None,
        engine: str = "h2",
        limits: H2Limits | None = None,
        service: InferenceService | None = None,
    ) -> None:
        if engine not in ("h2", "grpcio"):
            raise ValueError(f"unknown gRPC engine {engine!r}: 'h2' or 'grpcio'")
        self.service = service if service is not None else InferenceService(dataplane)
        """The service the calls go to (an ingest worker passes its own, which forwards all but inference)."""
        self.max_message_size = max_message_size
        self.restricted = restricted
        """``--grpc-restricted-protocol`` groups: calls without their metadata get UNAVAILABLE."""
        self.engine = engine
        self.limits = limits
        """The h2 engine's bounds per connection and process (``H2Limits``; None: its defaults)."""
        self.address: tuple[str, int] = ("", 0)
        self._server: grpc.aio.Server | None = None
        self._h2: H2GrpcServer | None = None
        self._stopping: asyncio.Future[None] | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on ``host:port`` (port 0: any free one, see ``address``); OSError when that fails. ``reuse_port``:
        share the port with other processes (SO_REUSEPORT, Triton's ``--reuse-grpc-port``: the ingest workers)."""
        target = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        await self._listen(target, host, port, reuse_port, None)

    async def start_unix(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (the engine's door for its ingest workers)."""
        await self._listen(f"unix:{path}", path, 0, False, path)

    async def _listen(self, target: str, host: str, port: int, reuse_port: bool, unix: str | None) -> None:
        if self.engine == "h2":
            self.service._encode = _wire
            h2 = H2GrpcServer(GrpcCalls(self.service, self.max_message_size, self.restricted), self.limits)
            try:
                bound = await (h2.start_unix(unix) if unix else h2.start(host, port, reuse_port=reuse_port))
            except OSError as exc:
                raise OSError(f"cannot listen on {target} for gRPC: {exc}") from None
            self._h2 = h2
            self.address = (host, bound)
            return
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", self.max_message_size),
                ("grpc.max_receive_message_length", self.max_message_size),
                # a port in use is an error, as in Triton (--reuse-grpc-port false), unless asked
                ("grpc.so_reuseport", int(reuse_port)),
            ],
            interceptors=[RestrictionInterceptor(self.restricted)] if self.restricted else None,
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.service, server)
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {target} for gRPC: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {target} for gRPC")
        await server.start()
        self._server = server
        self.address = (host, bound)

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new calls, let those in flight finish (up to ``grace_s``), end open streams, then stop."""
        self.service.drain()
        if self._h2 is not None:
            await self._h2.shutdown(grace_s)
        if self._server is not None:
            await self._server.stop(grace_s)

    def stop_now(self) -> None:
        """Cancel every call still running (a second signal)."""
        if self._h2 is not None:
            self._h2.stop_now()
        if self._server is not None and self._stopping is None:
            self._stopping = asyncio.ensure_future(self._server.stop(None))
