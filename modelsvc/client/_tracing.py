"""Client spans (placeholder with the agreed API; the OpenTelemetry implementation replaces it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class ClientSpan:
    def inject(self, headers: dict[str, str]) -> None:
        pass

    def record(self, *, batch_size: int | None, bytes_sent: int, bytes_received: int) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


@contextlib.contextmanager
def client_span(model: str, version: str | None, *, transport: str, server: str) -> Iterator[ClientSpan]:
    yield ClientSpan()
