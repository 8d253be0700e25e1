"""The HTTP/REST binding of the v2 protocol, over httpx: each operation once, errors as ClientError."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ..protocol import Tensor
from ._core import (
    InferResult,
    Prepared,
    build_infer,
    error_from_body,
    model_path,
    parse_infer,
    parse_json,
    supports_binary,
)
from ._errors import ClientError, ConnectError, Timeout


def _transport_error(exc: httpx.HTTPError) -> ClientError:
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"no answer in time: {exc!r}")
    return ConnectError(f"connection failed: {exc!r}")


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code in (429, 503):  # retryable answers become exceptions here, for the retry loop
        raise error_from_body(response.status_code, response.content)
    return response


class _HttpBase:
    scheme = "http"

    def __init__(self, url: str, binary: bool | None) -> None:
        self.base_url = url if "://" in url else f"http://{url}"
        self.server = httpx.URL(self.base_url).netloc.decode()
        self.binary = binary
        """None: use the binary tensor extension when the server lists it (asked once)."""

    @staticmethod
    def limits(max_connections: int) -> httpx.Limits:
        return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

    def prepare_infer(
        self,
        binary: bool,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        headers: dict[str, str],
    ) -> Prepared:
        prepared = build_infer(
            model, version, tensors, outputs, binary=binary, request_id=request_id, parameters=parameters
        )
        prepared.headers.update(headers)
        return prepared


class HttpTransport(_HttpBase):
    def __init__(
        self,
        url: str,
        *,
        binary: bool | None = None,
        max_connections: int = 32,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, binary)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=None,
            limits=self.limits(max_connections),
            headers=dict(headers or {}),
            transport=transport,
        )

    def _send(self, prepared: Prepared, timeout: float | None) -> httpx.Response:
        try:
            response = self._http.request(
                prepared.method, prepared.path, content=prepared.body, headers=prepared.headers, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        return _checked(response)

    def _json(self, path: str, timeout: float | None) -> dict[str, Any]:
        response = self._send(Prepared("GET", path, {}), timeout)
        return dict(parse_json(response.status_code, response.content))

    def _ok(self, path: str, timeout: float | None) -> bool:
        return self._send(Prepared("GET", path, {}), timeout).status_code == 200

    def live(self, timeout: float | None) -> bool:
        return self._ok("/v2/health/live", timeout)

    def ready(self, timeout: float | None) -> bool:
        return self._ok("/v2/health/ready", timeout)

    def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        return self._ok(model_path(name, version) + "/ready", timeout)

    def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return self._json("/v2", timeout)

    def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return self._json(model_path(name, version), timeout)

    def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return self._json(model_path(name, version) + "/config", timeout)

    def infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> tuple[InferResult, int, int]:
        if self.binary is None:
            self.binary = supports_binary(self.server_metadata(timeout))
        prepared = self.prepare_infer(self.binary, model, version, tensors, outputs, request_id, parameters, headers)
        response = self._send(prepared, timeout)
        result = parse_infer(response.status_code, response.headers, response.content)
        return result, len(prepared.body or b""), len(response.content)

    def close(self) -> None:
        self._http.close()


class AsyncHttpTransport(_HttpBase):
    def __init__(
        self,
        url: str,
        *,
        binary: bool | None = None,
        max_connections: int = 32,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, binary)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=None,
            limits=self.limits(max_connections),
            headers=dict(headers or {}),
            transport=transport,
        )

    async def _send(self, prepared: Prepared, timeout: float | None) -> httpx.Response:
        try:
            response = await self._http.request(
                prepared.method, prepared.path, content=prepared.body, headers=prepared.headers, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        return _checked(response)

    async def _json(self, path: str, timeout: float | None) -> dict[str, Any]:
        response = await self._send(Prepared("GET", path, {}), timeout)
        return dict(parse_json(response.status_code, response.content))

    async def _ok(self, path: str, timeout: float | None) -> bool:
        return (await self._send(Prepared("GET", path, {}), timeout)).status_code == 200

    async def live(self, timeout: float | None) -> bool:
        return await self._ok("/v2/health/live", timeout)

    async def ready(self, timeout: float | None) -> bool:
        return await self._ok("/v2/health/ready", timeout)

    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        return await self._ok(model_path(name, version) + "/ready", timeout)

    async def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return await self._json("/v2", timeout)

    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return await self._json(model_path(name, version), timeout)

    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return await self._json(model_path(name, version) + "/config", timeout)

    async def infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> tuple[InferResult, int, int]:
        if self.binary is None:
            self.binary = supports_binary(await self.server_metadata(timeout))
        prepared = self.prepare_infer(self.binary, model, version, tensors, outputs, request_id, parameters, headers)
        response = await self._send(prepared, timeout)
        result = parse_infer(response.status_code, response.headers, response.content)
        return result, len(prepared.body or b""), len(response.content)

    async def close(self) -> None:
        await self._http.aclose()
