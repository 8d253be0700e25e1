"""``Client`` and ``AsyncClient``: one API over any binding (``http://`` or ``grpc://``), with per-call
timeouts, retries within a budget, a span per call, and model handles. Only awaiting differs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from ..protocol import Tensor
from ._core import Attempts, InferCall, InferResult, ModelMetadata, tensor_count, to_tensor
from ._deadline import call_timeout, with_timeout_parameter
from ._errors import ClientError, ModelNotFound
from ._model import AsyncModel, Model
from ._replicas import AsyncReplicaTransport, ReplicaState, Resolver
from ._retry import RetryBudget, RetryPolicy
from ._sequence import AsyncInferSequence, InferSequence
from ._stream import (
    ResponseStream,
    StreamingTransport,
    StreamingUnsupported,
    SyncResponseStream,
    SyncStreamingTransport,
    _start_span,
)
from ._tracing import client_span
from ._transport import AsyncTransport, Transport

DEFAULT_TIMEOUT_S = 60.0
T = TypeVar("T")


def _binding(
    url: str,
    asynchronous: bool,
    binary: bool | None,
    max_connections: int,
    headers: Mapping[str, str] | None,
    transport: Any,
) -> Any:
    """The protocol binding for ``url``'s scheme, sync or async (imported only when used)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "http"
    if scheme in ("http", "https"):
        from ._http import AsyncHttpTransport, HttpTransport

        kind: Any = AsyncHttpTransport if asynchronous else HttpTransport
        return kind(url, binary=binary, max_connections=max_connections, headers=headers, transport=transport)
    if scheme == "grpc":
        from ._grpc import AsyncGrpcTransport, GrpcTransport

        target = url.split("://", 1)[1]
        return (AsyncGrpcTransport if asynchronous else GrpcTransport)(target, headers=headers)
    raise ValueError(f"unknown scheme {scheme!r} in {url!r}: use http://, https:// or grpc://")


def _replicas(
    url: str | Sequence[str],
    discovery: str,
    resolve: Resolver | None,
    binary: bool | None,
    max_connections: int,
    headers: Mapping[str, str] | None,
    transport: Any,
) -> AsyncTransport:
    """One binding over several replicas (a list of URLs, or one URL resolved by DNS)."""

    def make(u: str) -> AsyncTransport:
        binding: AsyncTransport = _binding(u, True, binary, max_connections, headers, transport)
        return binding

    if discovery == "dns":
        if not isinstance(url, str):
            raise ValueError("discovery='dns' takes one URL, whose host name resolves to the replicas")
        return AsyncReplicaTransport(make, dns=url, resolve=resolve)
    urls = list(url)
    if not urls:
        raise ValueError("give at least one model-service URL")
    if len(urls) == 1:  # one replica: the plain binding, as for a string
        return make(urls[0])
    return AsyncReplicaTransport(make, urls)


class _Common:
    def __init__(self, timeout: float | None, retry: RetryPolicy | None, budget: RetryBudget | None) -> None:
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.budget = budget if budget is not None else RetryBudget()

    def attempts(self, timeout: float | None) -> Attempts:
        """The tries of one call, within its timeout (the client's when None) and any deadline in force."""
        return Attempts(self.retry, self.budget, call_timeout(self.timeout if timeout is None else timeout))


class Client:
    """A synchronous v2 client. ``Client("localhost:8000")`` speaks HTTP, ``Client("grpc://localhost:8001")``
    gRPC; ``client.model("name")`` gives a handle that checks inputs before sending."""

    def __init__(
        self,
        url: str = "localhost:8000",
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        binary: bool | None = None,
        max_connections: int = 32,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._c = _Common(timeout, retry, budget)
        self._t: Transport = _binding(url, False, binary, max_connections, headers, transport)
        http = self._t.scheme in ("http", "https")
        self._sequence_starts = threading.Semaphore(max(1, max_connections // 2)) if http else None
        """Sequence starts in flight over HTTP, across threads: at most half the connections (see ``_sequence``)."""

    def _call(self, op: Callable[[float | None], T], timeout: float | None = None) -> T:
        tries = self._c.attempts(timeout)
        while True:
            try:
                return op(tries.remaining())
            except ClientError as error:
                time.sleep(tries.after_failure(error))

    def _probe(self, op: Callable[[float | None], bool]) -> bool:
        try:
            return self._call(op)
        except ClientError:
            return False

    def server_live(self) -> bool:
        return self._probe(self._t.live)

    def server_ready(self) -> bool:
        return self._probe(self._t.ready)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return self._probe(lambda t: self._t.model_ready(name, version, t))

    def server_metadata(self) -> dict[str, Any]:
        return self._call(self._t.server_metadata)

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self._call(lambda t: self._t.model_config(name, version, t))

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        data = self._call(lambda t: self._t.model_metadata(name, version, t))
        try:
            config: dict[str, Any] | None = self.model_config(name, version)
        except ModelNotFound:
            config = None  # servers without the configuration extension (MLServer): 404
        return ModelMetadata.from_json(data, config)

    def model(self, name: str, version: str | None = None) -> Model:
        """A handle that checks inputs against the model's metadata (read once, here) before sending."""
        return Model(self, self.model_metadata(name, version), version)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Run ``model`` on ``inputs`` (numpy arrays or plain values, by name); the outputs by name."""
        tensors = [to_tensor(name, value) for name, value in inputs.items()]
        return self._infer(model, version, tensors, outputs, request_id, parameters, timeout)

    def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult:
        with client_span(model, version, transport=self._t.scheme, server=self._t.server) as span:
            headers: dict[str, str] = {}
            span.inject(headers)
            try:
                reply = self._call(
                    lambda t: self._t.infer(
                        InferCall(
                            model,
                            version,
                            tensors,
                            outputs,
                            request_id,
                            parameters=with_timeout_parameter(parameters, t),
                            headers=headers,
                            timeout=t,
                        )
                    ),
                    timeout,
                )
            except ClientError as exc:
                span.fail(exc)
                raise
            span.record(
                batch_size=tensor_count(tensors), bytes_sent=reply.bytes_sent, bytes_received=reply.bytes_received
            )
            return reply.result

    def sequence(
        self, model: str, sequence_id: int | str | None = None, *, version: str | None = None
    ) -> InferSequence:
        """The requests of one sequence of a stateful model (see ``_sequence``): ``with client.sequence("m") as
        seq: seq.infer(...)``; the first carries sequence_start, ``end=True`` or leaving the block ends it.
        ``sequence_id`` (int, or str for a TYPE_STRING CORRID) is generated when not given."""
        return InferSequence(self, model, sequence_id, version)

    def stream_infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> SyncResponseStream:
        """Every response of a (decoupled) model to one request, as it is sent: ``for result in
        client.stream_infer("m", inputs)``; as ``AsyncClient.stream_infer`` (gRPC only)."""
        binding = self._t
        if not isinstance(binding, SyncStreamingTransport):
            raise StreamingUnsupported(
                f"streamed responses need gRPC's ModelStreamInfer: use a grpc:// URL ({binding.scheme} has none)"
            )
        tensors = [to_tensor(name, value) for name, value in inputs.items()]

        def open_call(headers: dict[str, str], left: float | None) -> Any:
            return binding.open_stream(
                InferCall(model, version, tensors, outputs, request_id, parameters, headers=headers, timeout=left)
            )

        return SyncResponseStream(
            open_call,
            lambda: self._c.attempts(timeout),
            lambda: _start_span(model, version, binding.scheme, binding.server),
        )

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of ``Client``: the same methods, awaited."""

    def __init__(
        self,
        url: str | Sequence[str] = "localhost:8000",
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        binary: bool | None = None,
        max_connections: int = 32,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        binding: AsyncTransport | None = None,
        discovery: str = "none",
        resolve: Resolver | None = None,
    ) -> None:
        """``binding`` replaces the URL's protocol binding with one of your own (an in-process engine, say).

        Several replicas of one model service: a list of URLs, or one URL with ``discovery="dns"`` (every
        address its host name resolves to, resolved again every few seconds; ``resolve`` replaces the
        resolver). Calls then go to the least busy replica and fail over (see ``_replicas``)."""
        self._c = _Common(timeout, retry, budget)
        if discovery not in ("none", "dns"):
            raise ValueError(f"discovery must be 'none' or 'dns', got {discovery!r}")
        if binding is not None:
            self._t: AsyncTransport = binding
        elif isinstance(url, str) and discovery == "none":
            self._t = _binding(url, True, binary, max_connections, headers, transport)
        else:
            self._t = _replicas(url, discovery, resolve, binary, max_connections, headers, transport)
        self._loop: asyncio.AbstractEventLoop | None = None
        http = binding is None and self._t.scheme in ("http", "https")
        self._sequence_starts = asyncio.Semaphore(max(1, max_connections // 2)) if http else None
        """Sequence starts in flight over HTTP: at most half the connections (see ``_sequence``)."""

    async def _call(self, op: Callable[[float | None], Awaitable[T]], timeout: float | None = None) -> T:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ClientError(
                "this AsyncClient belongs to the event loop it was first used on (its connections live there); "
                "create one AsyncClient per event loop"
            )
        tries = self._c.attempts(timeout)
        while True:
            try:
                return await op(tries.remaining())
            except ClientError as error:
                await asyncio.sleep(tries.after_failure(error))

    async def _probe(self, op: Callable[[float | None], Awaitable[bool]]) -> bool:
        try:
            return await self._call(op)
        except ClientError:
            return False

    async def server_live(self) -> bool:
        return await self._probe(self._t.live)

    async def server_ready(self) -> bool:
        return await self._probe(self._t.ready)

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        return await self._probe(lambda t: self._t.model_ready(name, version, t))

    async def server_metadata(self) -> dict[str, Any]:
        return await self._call(self._t.server_metadata)

    async def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return await self._call(lambda t: self._t.model_config(name, version, t))

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        data = await self._call(lambda t: self._t.model_metadata(name, version, t))
        try:
            config: dict[str, Any] | None = await self.model_config(name, version)
        except ModelNotFound:
            config = None  # servers without the configuration extension (MLServer): 404
        return ModelMetadata.from_json(data, config)

    async def model(self, name: str, version: str | None = None) -> AsyncModel:
        return AsyncModel(self, await self.model_metadata(name, version), version)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        tensors = [to_tensor(name, value) for name, value in inputs.items()]
        return await self._infer(model, version, tensors, outputs, request_id, parameters, timeout)

    async def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult:
        with client_span(model, version, transport=self._t.scheme, server=self._t.server) as span:
            headers: dict[str, str] = {}
            span.inject(headers)
            try:
                reply = await self._call(
                    lambda t: self._t.infer(
                        InferCall(
                            model,
                            version,
                            tensors,
                            outputs,
                            request_id,
                            parameters=with_timeout_parameter(parameters, t),
                            headers=headers,
                            timeout=t,
                        )
                    ),
                    timeout,
                )
            except ClientError as exc:
                span.fail(exc)
                raise
            span.record(
                batch_size=tensor_count(tensors), bytes_sent=reply.bytes_sent, bytes_received=reply.bytes_received
            )
            return reply.result

    def sequence(
        self, model: str, sequence_id: int | str | None = None, *, version: str | None = None
    ) -> AsyncInferSequence:
        """``async with client.sequence("m") as seq: await seq.infer(...)`` (see ``Client.sequence``). Over
        several replicas every request of the sequence goes to the replica that took its first."""
        return AsyncInferSequence(self, model, sequence_id, version)

    def stream_infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> ResponseStream:
        """Every response of a (decoupled) model to one request, as it is sent: ``async for result in
        client.stream_infer("m", inputs)``. gRPC only (``StreamingUnsupported`` over HTTP); ``timeout`` bounds the
        whole stream; leaving the loop early cancels it (see ``_stream``)."""
        tensors = [to_tensor(name, value) for name, value in inputs.items()]
        binding = self._t
        if not isinstance(binding, StreamingTransport):
            raise StreamingUnsupported(
                f"streamed responses need gRPC's ModelStreamInfer: use a grpc:// URL ({binding.scheme} has none)"
            )

        def open_call(headers: dict[str, str], left: float | None) -> Any:
            return binding.open_stream(
                InferCall(model, version, tensors, outputs, request_id, parameters, headers=headers, timeout=left)
            )

        return ResponseStream(
            open_call,
            lambda: self._c.attempts(timeout),
            lambda: _start_span(model, version, binding.scheme, binding.server),
        )

    def replicas(self) -> list[ReplicaState]:
        """The replicas' state (URL, calls outstanding, ejected); empty for a single model service."""
        return self._t.states() if isinstance(self._t, AsyncReplicaTransport) else []

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
