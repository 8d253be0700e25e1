"""The gRPC binding of the v2 protocol, over grpcio: each operation once, errors as ClientError.

Messages are tritonclient's generated ``service_pb2`` ones, so any KServe/Triton gRPC server answers. Tensors
travel as ``raw_input_contents`` (BYTES length-prefixed, BF16 as raw 16-bit words); answers are read from
``raw_output_contents``, or from the typed ``contents`` where a server sends those. Building requests and
reading answers happen once, here; the sync and async transports add only the calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..protocol import (
    InvalidArgument,
    Tensor,
    deserialize_bytes_tensor,
    numpy_dtype,
    tensor_bytes,
)
from ..protocol._pbjson import message_to_json
from ..protocol._pbparams import CONTENTS_FIELDS, parameters_from_proto, set_proto_parameter
from ._core import InferCall, InferReply, InferResult
from ._errors import ClientError, ConnectError, ConnectionLost, InvalidInput, ProtocolError, error_from_grpc
from ._stream import GrpcStreamCall, SyncGrpcStreamCall, stream_parameters

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# What grpcio's details say when UNAVAILABLE means "no connection", not "the server said it is unavailable":
# first, could not connect (nothing was sent: retried); then, the connection broke (maybe run: not retried).
_CONNECT_WORDS = (
    "failed to connect",
    "connection refused",
    "errors resolving",
    "dns resolution failed",
    "connection attempt timed out",
)
_LOST_WORDS = (
    "connection reset",
    "socket closed",
    "broken pipe",
    "end of tcp stream",
)

# -- no I/O: errors, requests, answers --------------------------------------------------------------------


def grpc_error(exc: grpc.RpcError) -> ClientError:
    """The ClientError for a failed call: a connection failure is ConnectError (retried like HTTP's)."""
    status = exc.code() if callable(getattr(exc, "code", None)) else None
    code = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    message = str(details or code)
    if code == "UNAVAILABLE" and any(word in message.lower() for word in _CONNECT_WORDS):
        return ConnectError(f"connection failed: {message}", code=code)
    if code == "UNAVAILABLE" and any(word in message.lower() for word in _LOST_WORDS):
        return ConnectionLost(f"connection lost after the request was sent: {message}", code=code)
    return error_from_grpc(code, message)


def _metadata(base: Mapping[str, str], extra: Mapping[str, str] | None) -> list[tuple[str, str]]:
    merged = {k.lower(): v for k, v in base.items()}
    merged.update((k.lower(), v) for k, v in (extra or {}).items())
    return list(merged.items())


def _set_parameter(target: Any, name: str, value: Any) -> None:
    """Fill one ``InferParameter``; a value of another type is the caller's mistake."""
    try:
        set_proto_parameter(target, name, value)
    except TypeError as exc:
        raise InvalidInput(str(exc)) from None


def build_request(
    model: str,
    version: str | None,
    tensors: Sequence[Tensor],
    outputs: Sequence[str] | None,
    request_id: str | None,
    parameters: Mapping[str, Any] | None,
) -> Any:
    """A ``ModelInferRequest`` with every input's bytes in ``raw_input_contents``."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version or "", id=request_id or "")
    for name, value in (parameters or {}).items():
        _set_parameter(request.parameters, name, value)
    for tensor in tensors:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        for name, value in tensor.parameters.items():
            _set_parameter(entry.parameters, name, value)
        request.raw_input_contents.append(tensor_bytes(tensor.datatype, tensor.data))
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def call_request(call: InferCall, *, stream: bool = False) -> Any:
    """The ``ModelInferRequest`` of one try of ``call``; a stream's asks for the empty final response."""
    parameters = stream_parameters(call.parameters) if stream else call.parameters
    return build_request(call.model, call.version, call.inputs, call.outputs, call.request_id, parameters)


def infer_reply(request: Any, response: Any) -> InferReply:
    """The reply to a ``ModelInfer`` call: the result, and the messages' sizes."""
    return InferReply(parse_response(response), request.ByteSize(), response.ByteSize())


def _output_array(entry: Any, raw: bytes | None) -> np.ndarray[Any, Any]:
    label = f"output '{entry.name}'"
    shape = tuple(int(d) for d in entry.shape)
    count = math.prod(shape)
    datatype = entry.datatype
    if datatype == "BYTES":
        if raw is not None:
            return deserialize_bytes_tensor(raw, count, label).reshape(shape)
        items = list(entry.contents.bytes_contents)
        if len(items) != count:
            raise InvalidArgument(f"{label}: {len(items)} BYTES elements, shape {list(shape)} needs {count}")
        array = np.empty(count, dtype=np.object_)
        array[:] = items
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise InvalidArgument(
                f"{label}: {len(raw)} bytes of {datatype} data, but shape {list(shape)} needs {count * dtype.itemsize}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidArgument(f"{label}: {datatype} comes only as raw_output_contents, and the answer has none")
    values = getattr(entry.contents, field)
    if len(values) != count:
        raise InvalidArgument(f"{label}: {len(values)} {datatype} elements, shape {list(shape)} needs {count}")
    return np.asarray(values, dtype=dtype).reshape(shape)


def parse_response(response: Any) -> InferResult:
    raws = list(response.raw_output_contents)
    if raws and len(raws) != len(response.outputs):
        raise ProtocolError(f"the answer has {len(response.outputs)} outputs but {len(raws)} raw_output_contents")
    outputs: dict[str, np.ndarray[Any, Any]] = {}
    datatypes: dict[str, str] = {}
    try:
        for index, entry in enumerate(response.outputs):
            outputs[entry.name] = _output_array(entry, raws[index] if raws else None)
            datatypes[entry.name] = entry.datatype
    except InvalidArgument as exc:
        raise ProtocolError(f"could not read the inference response: {exc.message}") from None
    return InferResult(
        model_name=response.model_name,
        model_version=response.model_version,
        outputs=outputs,
        datatypes=datatypes,
        id=response.id or None,
        parameters=parameters_from_proto(response.parameters),
    )


def _tensor_json(entry: Any) -> dict[str, Any]:
    return {"name": entry.name, "datatype": entry.datatype, "shape": [int(d) for d in entry.shape]}


def server_metadata_json(response: Any) -> dict[str, Any]:
    """The JSON shape of ``GET /v2``."""
    return {"name": response.name, "version": response.version, "extensions": list(response.extensions)}


def model_metadata_json(response: Any) -> dict[str, Any]:
    """The JSON shape of ``GET /v2/models/<m>``."""
    return {
        "name": response.name,
        "versions": list(response.versions),
        "platform": response.platform,
        "inputs": [_tensor_json(t) for t in response.inputs],
        "outputs": [_tensor_json(t) for t in response.outputs],
    }


def _model_request(kind: Any, name: str, version: str | None) -> Any:
    return kind(name=name, version=version or "")


class _GrpcBase:
    scheme = "grpc"

    def __init__(
        self,
        target: str,
        headers: Mapping[str, str] | None,
        max_send_message_length: int,
        max_receive_message_length: int,
        options: Sequence[tuple[str, Any]],
    ) -> None:
        self.server = target
        """host:port, for spans and messages."""
        self._headers = dict(headers or {})
        self._options = [
            ("grpc.max_send_message_length", max_send_message_length),
            ("grpc.max_receive_message_length", max_receive_message_length),
            *options,
        ]

    def metadata(self, headers: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
        return _metadata(self._headers, headers)


class GrpcTransport(_GrpcBase):
    """``GrpcTransport("localhost:8001")``: one channel, closed by ``close()``."""

    def __init__(
        self,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_send_message_length: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_receive_message_length: int = DEFAULT_MAX_MESSAGE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, headers, max_send_message_length, max_receive_message_length, options)
        self._channel = grpc.insecure_channel(target, options=self._options)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def _unary(self, method: str, request: Any, timeout: float | None, headers: Mapping[str, str] | None = None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self.metadata(headers))
        except grpc.RpcError as exc:
            raise grpc_error(exc) from exc

    def live(self, timeout: float | None) -> bool:
        return bool(self._unary("ServerLive", service_pb2.ServerLiveRequest(), timeout).live)

    def ready(self, timeout: float | None) -> bool:
        return bool(self._unary("ServerReady", service_pb2.ServerReadyRequest(), timeout).ready)

    def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        request = _model_request(service_pb2.ModelReadyRequest, name, version)
        return bool(self._unary("ModelReady", request, timeout).ready)

    def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return server_metadata_json(self._unary("ServerMetadata", service_pb2.ServerMetadataRequest(), timeout))

    def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        request = _model_request(service_pb2.ModelMetadataRequest, name, version)
        return model_metadata_json(self._unary("ModelMetadata", request, timeout))

    def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        request = _model_request(service_pb2.ModelConfigRequest, name, version)
        return message_to_json(self._unary("ModelConfig", request, timeout).config)

    def infer(self, call: InferCall) -> InferReply:
        request = call_request(call)
        return infer_reply(request, self._unary("ModelInfer", request, call.timeout, call.headers))

    def open_stream(self, call: InferCall) -> SyncGrpcStreamCall:
        """One ``ModelStreamInfer`` call for one request (see ``_stream``); opened on its first ``next()``."""
        request = call_request(call, stream=True)
        metadata, timeout = self.metadata(call.headers), call.timeout
        return SyncGrpcStreamCall(
            lambda requests: self._stub.ModelStreamInfer(requests, timeout=timeout, metadata=metadata),
            request,
            parse_response,
            grpc_error,
        )

    def close(self) -> None:
        self._channel.close()


class AsyncGrpcTransport(_GrpcBase):
    """The grpc.aio twin; its channel opens on first use, inside the event loop that uses it."""

    def __init__(
        self,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_send_message_length: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_receive_message_length: int = DEFAULT_MAX_MESSAGE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, headers, max_send_message_length, max_receive_message_length, options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    def _get_stub(self) -> Any:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.server, options=self._options)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def _unary(
        self, method: str, request: Any, timeout: float | None, headers: Mapping[str, str] | None = None
    ) -> Any:
        try:
            return await getattr(self._get_stub(), method)(request, timeout=timeout, metadata=self.metadata(headers))
        except grpc.RpcError as exc:
            raise grpc_error(exc) from exc

    async def live(self, timeout: float | None) -> bool:
        return bool((await self._unary("ServerLive", service_pb2.ServerLiveRequest(), timeout)).live)

    async def ready(self, timeout: float | None) -> bool:
        return bool((await self._unary("ServerReady", service_pb2.ServerReadyRequest(), timeout)).ready)

    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        request = _model_request(service_pb2.ModelReadyRequest, name, version)
        return bool((await self._unary("ModelReady", request, timeout)).ready)

    async def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return server_metadata_json(await self._unary("ServerMetadata", service_pb2.ServerMetadataRequest(), timeout))

    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        request = _model_request(service_pb2.ModelMetadataRequest, name, version)
        return model_metadata_json(await self._unary("ModelMetadata", request, timeout))

    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        request = _model_request(service_pb2.ModelConfigRequest, name, version)
        return message_to_json((await self._unary("ModelConfig", request, timeout)).config)

    async def infer(self, call: InferCall) -> InferReply:
        request = call_request(call)
        return infer_reply(request, await self._unary("ModelInfer", request, call.timeout, call.headers))

    def open_stream(self, call: InferCall) -> GrpcStreamCall:
        """One ``ModelStreamInfer`` call for one request (see ``_stream``); opened on its first ``next()``."""
        request = call_request(call, stream=True)
        metadata, timeout = self.metadata(call.headers), call.timeout
        return GrpcStreamCall(
            lambda: self._get_stub().ModelStreamInfer(timeout=timeout, metadata=metadata),
            request,
            parse_response,
            grpc_error,
        )

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
