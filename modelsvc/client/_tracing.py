"""OpenTelemetry CLIENT spans around model calls, and W3C trace context injected into each request.

The transports call it like this::

    with client_span(model, version, transport="http", server=base_url) as span:
        headers: dict[str, str] = {}
        span.inject(headers)
        ...send...
        span.record(batch_size=rows, bytes_sent=len(body), bytes_received=len(reply))

An exception leaving the ``with`` block marks the span failed (``fail`` does the same explicitly).

Spans come from the global tracer provider (``opentelemetry.trace.get_tracer("modelsvc.client")``). When the
application configured none, ``client_span`` returns a shared object whose methods do nothing: about a
microsecond per call. A span that the provider samples out still propagates its (unsampled) context, so the
model server follows the caller's sampling decision.
"""

from __future__ import annotations

import functools
from types import TracebackType
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = ["ClientSpan", "client_span", "start_span"]

ATTR_MODEL = "modelsvc.model.name"
ATTR_VERSION = "modelsvc.model.version"
ATTR_BATCH_SIZE = "modelsvc.batch_size"
ATTR_REQUEST_BYTES = "modelsvc.request.bytes"
ATTR_RESPONSE_BYTES = "modelsvc.response.bytes"
ATTR_OUTCOME = "modelsvc.outcome"
ATTR_TRANSPORT = "modelsvc.transport"
RPC_SYSTEM = "kserve_v2"

_TRACER = trace.get_tracer("modelsvc.client")
"""A proxy: it follows the global provider, also one set after this module was imported."""


class ClientSpan:
    """One model call's span: ``inject`` its context into the request, ``record`` the answer, or ``fail``."""

    __slots__ = ("_done", "_span", "_token")

    def __init__(self, span: Span | None) -> None:
        self._span = span
        self._token: object = None
        self._done = False

    def inject(self, headers: dict[str, str]) -> None:
        """Add ``traceparent`` (and ``tracestate``) to ``headers``; nothing when no span is recorded."""
        if self._span is not None:
            propagate.inject(headers, context=trace.set_span_in_context(self._span))

    def record(self, *, batch_size: int | None, bytes_sent: int, bytes_received: int) -> None:
        """The call succeeded: what it sent and received."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attributes({ATTR_REQUEST_BYTES: bytes_sent, ATTR_RESPONSE_BYTES: bytes_received, ATTR_OUTCOME: "ok"})
        if batch_size is not None:
            span.set_attribute(ATTR_BATCH_SIZE, batch_size)
        self._done = True

    def fail(self, exc: BaseException) -> None:
        """The call failed with ``exc``: outcome ``error``, its type as ``error.type``, status ERROR."""
        span = self._span
        if span is None or not span.is_recording():
            return
        name = type(exc).__qualname__
        span.set_attributes({ATTR_OUTCOME: "error", "error.type": name})
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{name}: {exc}"))
        self._done = True

    # -- as a context manager (the span is the current one inside the block) ------------------------
    def __enter__(self) -> ClientSpan:
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        span = self._span
        if span is None:
            return
        if exc is not None and not self._done:
            self.fail(exc)
        elif not self._done and span.is_recording():
            span.set_attribute(ATTR_OUTCOME, "ok")
        otel_context.detach(self._token)  # type: ignore[arg-type]
        span.end()


class _NoSpan(ClientSpan):
    """What ``client_span`` returns when nothing is traced: shared, stateless, every method a no-op."""

    __slots__ = ()

    def inject(self, headers: dict[str, str]) -> None:
        pass

    def record(self, *, batch_size: int | None, bytes_sent: int, bytes_received: int) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass

    def __enter__(self) -> ClientSpan:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


_NO_SPAN = _NoSpan(None)


@functools.lru_cache(maxsize=64)
def _server_attributes(server: str) -> dict[str, str | int]:
    """``host:port`` or a URL -> ``server.address`` and ``server.port``."""
    parts = urlsplit(server if "://" in server else f"//{server}")
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or server
    return {"server.address": host} if port is None else {"server.address": host, "server.port": port}


def start_span(model: str, version: str | None, *, transport: str, server: str, method: str = "ModelInfer") -> Span:
    """A CLIENT span ``infer {model}`` for one ``method`` call to ``server`` over ``transport``, started (not
    current), with its attributes when it records."""
    span = _TRACER.start_span(f"infer {model}", kind=SpanKind.CLIENT)
    if span.is_recording():
        attributes: dict[str, str | int] = {
            ATTR_MODEL: model,
            "rpc.system": RPC_SYSTEM,
            "rpc.method": method,
            ATTR_TRANSPORT: transport,
            **_server_attributes(server),
        }
        if version:
            attributes[ATTR_VERSION] = version
        span.set_attributes(attributes)
    return span


def client_span(model: str, version: str | None, *, transport: str, server: str) -> ClientSpan:
    """A CLIENT span ``infer {model}`` for one call to ``server`` over ``transport`` (``http`` or ``grpc``).

    Use it as a context manager; it is a child of the current span, and current inside the block.
    """
    span = start_span(model, version, transport=transport, server=server)
    if not span.is_recording() and not span.get_span_context().is_valid:
        return _NO_SPAN
    return ClientSpan(span)  # sampled out (not recording): the decision still propagates
