"""The HTTP clients: ``Client`` (sync) and ``AsyncClient``, over httpx. Each method prepares its request
with the I/O-free core, sends it, and reads the answer with the core; only sending and sleeping differ."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

from ._core import (
    Attempts,
    InferResult,
    ModelMetadata,
    Prepared,
    build_infer,
    error_from_body,
    model_path,
    parse_infer,
    parse_json,
    supports_binary,
    tensor_count,
    to_tensor,
)
from ._errors import ClientError, ConnectError, ModelNotFound, Timeout
from ._retry import RetryBudget, RetryPolicy
from ._tracing import client_span

if TYPE_CHECKING:
    from ._model import AsyncModel, Model

DEFAULT_TIMEOUT_S = 60.0


class _Settings:
    """What both clients are configured with, and the decisions that need no I/O."""

    def __init__(
        self,
        url: str,
        timeout: float | None,
        retry: RetryPolicy | None,
        budget: RetryBudget | None,
        binary: bool | None,
    ) -> None:
        self.base_url = url if "://" in url else f"http://{url}"
        self.server = httpx.URL(self.base_url).netloc.decode()
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.budget = budget if budget is not None else RetryBudget()
        self.binary = binary
        """None: use the binary tensor extension when the server lists it (read once)."""

    def attempts(self, timeout: float | None) -> Attempts:
        return Attempts(self.retry, self.budget, self.timeout if timeout is None else timeout)

    def tensors(self, inputs: Mapping[str, Any]) -> list[Any]:
        return [to_tensor(name, value) for name, value in inputs.items()]


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)


def _transport_error(exc: httpx.HTTPError) -> ClientError:
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"no answer in time: {exc!r}")
    return ConnectError(f"connection failed: {exc!r}")


class Client:
    """A synchronous v2 client. ``Client("localhost:8000")``; ``client.model("name")`` for a checked handle."""

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
        self._s = _Settings(url, timeout, retry, budget, binary)
        self._http = httpx.Client(
            base_url=self._s.base_url,
            timeout=None,
            limits=_limits(max_connections),
            headers=dict(headers or {}),
            transport=transport,
        )

    # -- plumbing ---------------------------------------------------------------------------------------
    def _send(self, prepared: Prepared, timeout: float | None) -> httpx.Response:
        tries = self._s.attempts(timeout)
        while True:
            try:
                response = self._http.request(
                    prepared.method,
                    prepared.path,
                    content=prepared.body,
                    headers=prepared.headers,
                    timeout=tries.remaining(),
                )
                if response.status_code in (429, 503):
                    raise error_from_body(response.status_code, response.content)
                return response
            except httpx.HTTPError as exc:
                error = _transport_error(exc)
            except ClientError as exc:
                error = exc
            time.sleep(tries.after_failure(error))

    def _get_json(self, path: str, timeout: float | None = None) -> Any:
        response = self._send(Prepared("GET", path, {}), timeout)
        return parse_json(response.status_code, response.content)

    def _probe(self, path: str, timeout: float | None = None) -> bool:
        try:
            return self._send(Prepared("GET", path, {}), timeout).status_code == 200
        except ClientError:
            return False

    def _binary(self) -> bool:
        if self._s.binary is None:
            self._s.binary = supports_binary(self.server_metadata())
        return self._s.binary

    # -- the API ----------------------------------------------------------------------------------------
    def server_live(self) -> bool:
        return self._probe("/v2/health/live")

    def server_ready(self) -> bool:
        return self._probe("/v2/health/ready")

    def server_metadata(self) -> dict[str, Any]:
        return dict(self._get_json("/v2"))

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return self._probe(model_path(name, version) + "/ready")

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return dict(self._get_json(model_path(name, version) + "/config"))

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        data = self._get_json(model_path(name, version))
        try:
            config: dict[str, Any] | None = self.model_config(name, version)
        except (ModelNotFound, ClientError):
            config = None  # servers without the configuration extension (MLServer)
        return ModelMetadata.from_json(data, config)

    def model(self, name: str, version: str | None = None) -> Model:
        """A handle that checks inputs against the model's metadata (read once, here) before sending."""
        from ._model import Model

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
        """Run ``model`` on ``inputs`` (numpy arrays or plain values by name); outputs by name."""
        return self._infer(model, version, self._s.tensors(inputs), outputs, request_id, parameters, timeout)

    def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Any],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult:
        prepared = build_infer(
            model, version, tensors, outputs, binary=self._binary(), request_id=request_id, parameters=parameters
        )
        with client_span(model, version, transport="http", server=self._s.server) as span:
            span.inject(prepared.headers)
            try:
                response = self._send(prepared, timeout)
                result = parse_infer(response.status_code, response.headers, response.content)
            except ClientError as exc:
                span.fail(exc)
                raise
            span.record(
                batch_size=tensor_count(tensors),
                bytes_sent=len(prepared.body or b""),
                bytes_received=len(response.content),
            )
            return result

    def close(self) -> None:
        self._http.close()

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
        url: str = "localhost:8000",
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        binary: bool | None = None,
        max_connections: int = 32,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._s = _Settings(url, timeout, retry, budget, binary)
        self._http = httpx.AsyncClient(
            base_url=self._s.base_url,
            timeout=None,
            limits=_limits(max_connections),
            headers=dict(headers or {}),
            transport=transport,
        )

    async def _send(self, prepared: Prepared, timeout: float | None) -> httpx.Response:
        tries = self._s.attempts(timeout)
        while True:
            try:
                response = await self._http.request(
                    prepared.method,
                    prepared.path,
                    content=prepared.body,
                    headers=prepared.headers,
                    timeout=tries.remaining(),
                )
                if response.status_code in (429, 503):
                    raise error_from_body(response.status_code, response.content)
                return response
            except httpx.HTTPError as exc:
                error = _transport_error(exc)
            except ClientError as exc:
                error = exc
            await asyncio.sleep(tries.after_failure(error))

    async def _get_json(self, path: str, timeout: float | None = None) -> Any:
        response = await self._send(Prepared("GET", path, {}), timeout)
        return parse_json(response.status_code, response.content)

    async def _probe(self, path: str, timeout: float | None = None) -> bool:
        try:
            return (await self._send(Prepared("GET", path, {}), timeout)).status_code == 200
        except ClientError:
            return False

    async def _binary(self) -> bool:
        if self._s.binary is None:
            self._s.binary = supports_binary(await self.server_metadata())
        return self._s.binary

    async def server_live(self) -> bool:
        return await self._probe("/v2/health/live")

    async def server_ready(self) -> bool:
        return await self._probe("/v2/health/ready")

    async def server_metadata(self) -> dict[str, Any]:
        return dict(await self._get_json("/v2"))

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        return await self._probe(model_path(name, version) + "/ready")

    async def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return dict(await self._get_json(model_path(name, version) + "/config"))

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        data = await self._get_json(model_path(name, version))
        try:
            config: dict[str, Any] | None = await self.model_config(name, version)
        except ClientError:
            config = None
        return ModelMetadata.from_json(data, config)

    async def model(self, name: str, version: str | None = None) -> AsyncModel:
        from ._model import AsyncModel

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
        return await self._infer(model, version, self._s.tensors(inputs), outputs, request_id, parameters, timeout)

    async def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Any],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult:
        binary = await self._binary()
        prepared = build_infer(
            model, version, tensors, outputs, binary=binary, request_id=request_id, parameters=parameters
        )
        with client_span(model, version, transport="http", server=self._s.server) as span:
            span.inject(prepared.headers)
            try:
                response = await self._send(prepared, timeout)
                result = parse_infer(response.status_code, response.headers, response.content)
            except ClientError as exc:
                span.fail(exc)
                raise
            span.record(
                batch_size=tensor_count(tensors),
                bytes_sent=len(prepared.body or b""),
                bytes_received=len(response.content),
            )
            return result

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
