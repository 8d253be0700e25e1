"""What a client needs from a protocol binding: each operation once, errors as ClientError.

Retries, timeouts across attempts, tracing and model handles live above, in the clients, so HTTP and
gRPC (and any other binding) behave the same. ``timeout`` is the time left for this one attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..protocol import Tensor
from ._core import InferResult


class Transport(Protocol):
    scheme: str
    server: str
    """host:port, for spans and messages."""

    def live(self, timeout: float | None) -> bool: ...
    def ready(self, timeout: float | None) -> bool: ...
    def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool: ...
    def server_metadata(self, timeout: float | None) -> dict[str, Any]: ...
    def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]: ...
    def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        """Triton's config JSON; raise ClientError where the server has none (e.g. MLServer)."""
        ...

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
        """The result, bytes sent and bytes received. ``headers`` carries trace context (HTTP headers or
        gRPC metadata)."""
        ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    scheme: str
    server: str

    async def live(self, timeout: float | None) -> bool: ...
    async def ready(self, timeout: float | None) -> bool: ...
    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool: ...
    async def server_metadata(self, timeout: float | None) -> dict[str, Any]: ...
    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]: ...
    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]: ...
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
    ) -> tuple[InferResult, int, int]: ...
    async def close(self) -> None: ...
