"""What the engine asks of tracing: two Protocols, so the engine never imports the server that implements them.

The doors start a request's trace (``DataPlane.tracing.start``), name its request, and end it with their status;
the data plane marks it enqueued and hands it to the scheduler, which sees it as a ``TracedRequest``.
``modelsvc.server.observe`` implements both with OpenTelemetry (``ServerTracing``, ``RequestTrace``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..scheduler import TracedRequest


class Trace(TracedRequest, Protocol):
    """One sampled request's trace, from the door that received it to the batch that ran it."""

    def request(self, request_id: str | None) -> None:
        """The request's id, once the door has decoded it."""

    def set_attribute(self, key: str, value: str | int) -> None:
        """One more attribute on the request's span (a door's own, e.g. its status code)."""

    def enqueued(self, version: str) -> None:
        """The request enters the queue of model version ``version``."""

    def end(self, status: int, error: BaseException | None) -> None:
        """The door's answer: its HTTP status (gRPC answers map theirs), and the error if there was one."""


class Tracing(Protocol):
    """Starts the traces of sampled requests (``--trace-config mode=opentelemetry``)."""

    def start(self, model: str, version: str | None, headers: Sequence[tuple[bytes, bytes]]) -> Trace | None:
        """A trace for a request to ``model`` carrying W3C context in ``headers``; None when not sampled."""

    def shutdown(self) -> None:
        """Export what is still buffered and stop."""
