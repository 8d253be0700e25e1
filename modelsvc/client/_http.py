"""The HTTP/REST binding of the v2 protocol, over httpx: each operation once, errors as ClientError."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import httpx

from ._core import (
    InferCall,
    InferReply,
    Prepared,
    build_infer,
    error_from_body,
    model_path,
    parse_infer,
    parse_json,
    supports_binary,
)
from ._errors import ClientError, ConnectError, ConnectionLost, ModelNotFound, Timeout


def _transport_error(exc: httpx.HTTPError) -> ClientError:
    """Could not connect (nothing sent: retryable), ran out of time, or lost the connection after sending
    (the server may have run the request: not retried by default)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ConnectError(f"could not connect: {exc!r}")
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"no answer in time: {exc!r}")
    return ConnectionLost(f"the connection broke after the request was sent: {exc!r}")


class _Answer(NamedTuple):
    status: int
    headers: httpx.Headers
    content: bytes


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout("no answer within the call's timeout")
    return left


def _check_time(deadline: float | None, received: int) -> None:
    """httpx's timeouts bound each read, not the whole answer: a server that trickles bytes is cut off here."""
    if deadline is not None and time.monotonic() > deadline:
        raise Timeout(f"the answer was still arriving ({received} bytes) when the call's time ran out")


def _checked(answer: _Answer) -> _Answer:
    if answer.status in (429, 503):  # retryable answers become exceptions here, for the retry loop
        raise error_from_body(answer.status, answer.content)
    return answer


class _HttpBase:
    def __init__(self, url: str, binary: bool | None) -> None:
        self.base_url = url if "://" in url else f"http://{url}"
        self.scheme = httpx.URL(self.base_url).scheme
        self.server = httpx.URL(self.base_url).netloc.decode()
        self.binary = binary
        """None: use the binary tensor extension when the server lists it (asked once)."""

    @staticmethod
    def limits(max_connections: int) -> httpx.Limits:
        return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

    @staticmethod
    def prepare_infer(binary: bool, call: InferCall) -> Prepared:
        prepared = build_infer(
            call.model,
            call.version,
            call.inputs,
            call.outputs,
            binary=binary,
            request_id=call.request_id,
            parameters=call.parameters,
        )
        prepared.headers.update(call.headers)
        return prepared

    @staticmethod
    def infer_reply(prepared: Prepared, answer: _Answer) -> InferReply:
        result = parse_infer(answer.status, answer.headers, answer.content)
        return InferReply(result, len(prepared.body or b""), len(answer.content))


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

    def _send(self, prepared: Prepared, timeout: float | None) -> _Answer:
        deadline = _deadline(timeout)
        request = self._http.build_request(
            prepared.method, prepared.path, content=prepared.body, headers=prepared.headers, timeout=timeout
        )
        try:
            response = self._http.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                received = 0
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    received += len(chunk)
                    _check_time(deadline, received)
            finally:
                response.close()
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        return _checked(_Answer(response.status_code, response.headers, b"".join(chunks)))

    def _json(self, path: str, timeout: float | None) -> dict[str, Any]:
        answer = self._send(Prepared("GET", path, {}), timeout)
        return dict(parse_json(answer.status, answer.content))

    def _ok(self, path: str, timeout: float | None) -> bool:
        return self._send(Prepared("GET", path, {}), timeout).status == 200

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

    def infer(self, call: InferCall) -> InferReply:
        deadline = _deadline(call.timeout)
        if self.binary is None:
            try:
                self.binary = supports_binary(self.server_metadata(call.timeout))
            except ModelNotFound:  # no GET /v2 at all: no extensions, so JSON
                self.binary = False
        prepared = self.prepare_infer(self.binary, call)
        return self.infer_reply(prepared, self._send(prepared, _left(deadline)))

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

    async def _send(self, prepared: Prepared, timeout: float | None) -> _Answer:
        deadline = _deadline(timeout)
        request = self._http.build_request(
            prepared.method, prepared.path, content=prepared.body, headers=prepared.headers, timeout=timeout
        )
        try:
            response = await self._http.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                received = 0
                async for chunk in response.aiter_bytes():
                    chunks.append(chunk)
                    received += len(chunk)
                    _check_time(deadline, received)
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        return _checked(_Answer(response.status_code, response.headers, b"".join(chunks)))

    async def _json(self, path: str, timeout: float | None) -> dict[str, Any]:
        answer = await self._send(Prepared("GET", path, {}), timeout)
        return dict(parse_json(answer.status, answer.content))

    async def _ok(self, path: str, timeout: float | None) -> bool:
        return (await self._send(Prepared("GET", path, {}), timeout)).status == 200

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

    async def infer(self, call: InferCall) -> InferReply:
        deadline = _deadline(call.timeout)
        if self.binary is None:
            try:
                self.binary = supports_binary(await self.server_metadata(call.timeout))
            except ModelNotFound:  # no GET /v2 at all: no extensions, so JSON
                self.binary = False
        prepared = self.prepare_infer(self.binary, call)
        return self.infer_reply(prepared, await self._send(prepared, _left(deadline)))

    async def close(self) -> None:
        await self._http.aclose()
