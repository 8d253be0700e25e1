"""OpenTelemetry tracing of inference requests, configured by tritonserver's ``--trace-config`` flags.

Off by default: then no tracer provider exists, the OTLP exporter is not imported, and a request pays one
``is None`` check in ``InferEndpoint.handle`` and one per request of each batch in the scheduler.

What one traced request records (spans from the request's own trace, in its own trace)::

    infer {model}     SERVER  parent: the caller's W3C ``traceparent``; model, version, request id, outcome, status
    ├── queue         INTERNAL  from the enqueue until the batch holding the request starts
    ├── compute       INTERNAL  the execution of that batch; ``modelsvc.batch_size`` (rows), link -> batch span
    └── batch {model} INTERNAL  only under the first traced request of a batch: one per executed batch,
                                ``modelsvc.batch_size``, ``modelsvc.batch.requests``, ``modelsvc.padded_length``
                                (padding-aware batching only: the length the batch's inputs were padded to),
                                links -> every traced request's server span (the other requests live in their
                                own traces)

So each request's trace shows its time in the queue and the batch that executed it (``compute``, with the
batch's size and a link to the ``batch`` span); the ``batch`` span links back to each request it served.

Sampling follows Triton's ``rate`` (every N-th request without a trace context is traced; 0: none) and W3C's
parent-based rule for requests that carry a ``traceparent`` (the caller's sampled flag decides). With
``OTEL_TRACES_SAMPLER`` set and no ``rate`` flag the SDK's sampler from the environment is used instead.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from ... import __version__

logger = logging.getLogger("modelsvc.tracing")

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "modelsvc"

# attribute names, shared with the client's spans where they mean the same thing
ATTR_MODEL = "modelsvc.model.name"
ATTR_VERSION = "modelsvc.model.version"
ATTR_REQUEST_ID = "modelsvc.request.id"
ATTR_OUTCOME = "modelsvc.outcome"
ATTR_BATCH_SIZE = "modelsvc.batch_size"
ATTR_BATCH_REQUESTS = "modelsvc.batch.requests"
ATTR_PADDED_LENGTH = "modelsvc.padded_length"
ATTR_HTTP_STATUS = "http.response.status_code"


class TraceConfigError(ValueError):
    """A ``--trace-config`` value modelsvc does not understand (the message says which and why)."""


@dataclass(slots=True)
class TraceSettings:
    """What the ``--trace-config`` flags say; the defaults are Triton's, except where noted."""

    mode: str = "triton"
    """``triton`` (Triton's JSON trace files: not supported, tracing stays off) or ``opentelemetry``."""
    level: str | None = None
    """``TIMESTAMPS`` or ``OFF``. Unset: ``TIMESTAMPS`` in opentelemetry mode (Triton: OFF, which would make
    ``mode=opentelemetry`` alone do nothing), ``OFF`` otherwise."""
    rate: int | None = None
    """Trace every N-th request that carries no trace context (0: only requests that carry one). Unset: the
    sampler from ``OTEL_TRACES_SAMPLER`` when that is set, else Triton's 1000."""
    count: int = -1
    """How many requests to trace in all; -1: no limit."""
    url: str | None = None
    """OTLP/HTTP endpoint. Unset: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` +
    ``/v1/traces``, else ``http://localhost:4318/v1/traces``."""
    resource: dict[str, str] = field(default_factory=dict)
    """Resource attributes; they win over ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``.
    ``service.name`` defaults to ``modelsvc``."""
    bsp_max_queue_size: int | None = None
    """Batch span processor settings; unset: ``OTEL_BSP_*`` or the SDK's defaults."""
    bsp_schedule_delay: int | None = None
    bsp_max_export_batch_size: int | None = None

    @property
    def enabled(self) -> bool:
        return self.mode == "opentelemetry" and (self.level or "TIMESTAMPS") != "OFF"


_GLOBAL_INT = {"rate", "count"}
_OTEL_INT = {"bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"}


def parse_trace_config(values: Sequence[str]) -> TraceSettings:
    """``--trace-config [<mode>,]<setting>=<value>`` flags (in order; later ones win) -> settings."""
    settings = TraceSettings()
    for text in values:
        scope, _, assignment = text.partition(",") if "," in text.split("=", 1)[0] else ("", "", text)
        key, eq, value = assignment.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise TraceConfigError(f"--trace-config {text!r}: expected [<mode>,]<setting>=<value>")
        if scope == "":
            _set_global(settings, key, value, text)
        elif scope == "opentelemetry":
            _set_otel(settings, key, value, text)
        elif scope == "triton":
            logger.warning("--trace-config %s: Triton's trace files are not supported; ignored", text)
        else:
            raise TraceConfigError(f"--trace-config {text!r}: unknown mode {scope!r} (triton or opentelemetry)")
    queue, batch = settings.bsp_max_queue_size, settings.bsp_max_export_batch_size
    if queue is not None and batch is not None and batch > queue:
        raise TraceConfigError("--trace-config: bsp_max_export_batch_size must not exceed bsp_max_queue_size")
    return settings


def _int(value: str, text: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceConfigError(f"--trace-config {text!r}: {value!r} is not an integer") from None
    if number < minimum:
        raise TraceConfigError(f"--trace-config {text!r}: must be at least {minimum}")
    return number


def _set_global(settings: TraceSettings, key: str, value: str, text: str) -> None:
    if key == "mode":
        if value not in ("triton", "opentelemetry"):
            raise TraceConfigError(f"--trace-config {text!r}: mode is triton or opentelemetry")
        settings.mode = value
    elif key == "level":
        level = value.upper()
        if level == "TENSORS":
            raise TraceConfigError(f"--trace-config {text!r}: TENSORS is not supported in opentelemetry mode")
        if level not in ("TIMESTAMPS", "OFF"):
            raise TraceConfigError(f"--trace-config {text!r}: level is TIMESTAMPS or OFF")
        settings.level = level
    elif key == "rate":
        settings.rate = _int(value, text, 0)
    elif key == "count":
        settings.count = _int(value, text, -1)
    else:
        raise TraceConfigError(f"--trace-config {text!r}: unknown setting {key!r} (mode, level, rate, count)")


def _set_otel(settings: TraceSettings, key: str, value: str, text: str) -> None:
    if key == "url":
        if not value:
            raise TraceConfigError(f"--trace-config {text!r}: empty url")
        settings.url = value if "://" in value else f"http://{value}"
    elif key == "resource":
        name, eq, attr = value.partition("=")
        if not eq or not name.strip():
            raise TraceConfigError(f"--trace-config {text!r}: expected resource=<key>=<value>")
        settings.resource[name.strip()] = attr.strip()
    elif key in _OTEL_INT:
        setattr(settings, key, _int(value, text, 1))
    else:
        raise TraceConfigError(
            f"--trace-config {text!r}: unknown opentelemetry setting {key!r} "
            "(url, resource, bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)"
        )


# -- per request -------------------------------------------------------------------------------------


class RequestTrace:
    """The spans of one sampled request. Created by ``ServerTracing.start``; used on the event loop only."""

    __slots__ = ("_compute", "_context", "_queue", "_tracer", "model", "span")

    def __init__(self, tracer: trace.Tracer, span: trace.Span, model: str) -> None:
        self._tracer = tracer
        self.span = span
        self.model = model
        self._context = trace.set_span_in_context(span)
        self._queue: trace.Span | None = None
        self._compute: trace.Span | None = None

    def request(self, request_id: str | None) -> None:
        """The request decoded: record its id."""
        if request_id:
            self.span.set_attribute(ATTR_REQUEST_ID, request_id)

    def set_attribute(self, key: str, value: str | int) -> None:
        """One more attribute on the request's span (the gRPC door records its status code)."""
        self.span.set_attribute(key, value)

    def enqueued(self, version: str) -> None:
        """The request passed validation and enters its model version's queue."""
        self.span.set_attribute(ATTR_VERSION, version)
        self._queue = self._tracer.start_span("queue", self._context)

    def batch_started(self, batch: Sequence[RequestTrace], rows: int, padded_length: int | None = None) -> BatchTrace:
        """The batch holding ``batch`` (this request first) starts with ``rows`` rows, its inputs padded to
        ``padded_length`` (None: the model does not pad): the scheduler's hook."""
        attributes = {ATTR_BATCH_SIZE: rows, ATTR_BATCH_REQUESTS: len(batch)}
        links = [Link(t.span.get_span_context()) for t in batch]
        span_attributes = attributes if padded_length is None else {**attributes, ATTR_PADDED_LENGTH: padded_length}
        batch_span = self._tracer.start_span(
            f"batch {self.model}", self._context, attributes=span_attributes, links=links
        )
        to_batch = [Link(batch_span.get_span_context())]
        computes = []
        for t in batch:
            if t._queue is not None:
                t._queue.end()
                t._queue = None
            t._compute = t._tracer.start_span("compute", t._context, attributes=attributes, links=to_batch)
            computes.append(t._compute)
        return BatchTrace(batch_span, computes)

    def end(self, status: int, error: BaseException | None) -> None:
        """The answer is known (``status``), or the caller went away (``error`` is CancelledError)."""
        span = self.span
        if error is None:
            span.set_attributes({ATTR_OUTCOME: "ok", ATTR_HTTP_STATUS: status})
        else:
            cancelled = not isinstance(error, Exception)
            span.set_attributes(
                {
                    ATTR_OUTCOME: "cancelled" if cancelled else "error",
                    ATTR_HTTP_STATUS: status,
                    "error.type": type(error).__qualname__,
                }
            )
            span.set_status(Status(StatusCode.ERROR, None if cancelled else str(error)))
        for child in (self._queue, self._compute):
            if child is not None and child.is_recording():
                child.end()
        self._queue = self._compute = None
        span.end()


class BatchTrace:
    """The spans of one executing batch; ``finished`` is the scheduler's hook when the batch is done."""

    __slots__ = ("_computes", "span")

    def __init__(self, span: trace.Span, computes: list[trace.Span]) -> None:
        self.span = span
        self._computes = computes

    def finished(self, error: BaseException | None, timings: tuple[int, int, int] | None) -> None:
        """``timings``: input, infer and output nanoseconds of the execution (None when it failed)."""
        if timings is not None:
            self.span.set_attributes(
                {
                    "modelsvc.compute_input_ns": timings[0],
                    "modelsvc.compute_infer_ns": timings[1],
                    "modelsvc.compute_output_ns": timings[2],
                }
            )
        for span in (self.span, *self._computes):
            if span.is_recording():  # a compute span ends early when its caller went away
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                span.end()


# -- the server's tracer -----------------------------------------------------------------------------


def _carrier(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}


def _has_traceparent(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return any(key == b"traceparent" for key, _ in headers)


class TritonSampler(Sampler):
    """Triton's ``rate`` and ``count``, with W3C parent-based sampling for requests that carry a context.

    ``take_root`` decides for a request without a trace context (every ``rate``-th; 0: none); a request with
    one follows its caller's sampled flag; the queue, compute and batch spans of a request follow the request.
    ``count`` (-1: no limit) bounds the requests traced in all.
    """

    def __init__(self, rate: int, count: int = -1) -> None:
        self.rate = rate
        self._seen = itertools.count(1)
        self._left = count

    def take_root(self) -> bool:
        """Whether to trace the next request that carries no trace context."""
        return self.rate > 0 and next(self._seen) % self.rate == 0 and self._take()

    def _take(self) -> bool:
        if self._left == 0:
            return False
        if self._left > 0:
            self._left -= 1
        return True

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid:  # a request without context: ServerTracing.start took it with take_root
            sampled = True
        elif kind is SpanKind.SERVER:  # the caller's decision, within count
            sampled = parent.trace_flags.sampled and self._take()
        else:  # queue, compute, batch: as their request
            sampled = parent.trace_flags.sampled
        if sampled:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state)
        return SamplingResult(Decision.DROP, None, parent.trace_state)

    def get_description(self) -> str:
        return f"TritonSampler{{rate={self.rate}}}"


class ServerTracing:
    """Starts the server span of each sampled request; owns the tracer provider it was given.

    With Triton's sampler and W3C propagation (the default), a request without ``traceparent`` that the rate
    skips costs one scan of its header names: no context extraction, no span.
    """

    def __init__(self, provider: TracerProvider, sampler: TritonSampler | None, *, w3c: bool = True) -> None:
        self.provider = provider
        self.sampler = sampler
        self.tracer = provider.get_tracer("modelsvc.server", __version__)
        self._w3c = w3c

    def start(self, model: str, version: str | None, headers: Sequence[tuple[bytes, bytes]]) -> RequestTrace | None:
        """The request's trace, or None when it is not sampled."""
        context = None
        if not (self._w3c and not _has_traceparent(headers)):
            context = propagate.extract(_carrier(headers))
        sampler = self.sampler
        if (
            sampler is not None
            and (context is None or not trace.get_current_span(context).get_span_context().is_valid)
            and not sampler.take_root()
        ):
            return None
        span = self.tracer.start_span(
            f"infer {model}",
            context,
            kind=SpanKind.SERVER,
            attributes={ATTR_MODEL: model} if version is None else {ATTR_MODEL: model, ATTR_VERSION: version},
        )
        if not span.is_recording():
            return None
        return RequestTrace(self.tracer, span, model)

    def shutdown(self) -> None:
        """Export what is buffered and stop (blocking: run it off the event loop)."""
        self.provider.shutdown()


def start_tracing(
    settings: TraceSettings,
    exporter: SpanExporter | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> ServerTracing | None:
    """A tracer for the settings, exporting over OTLP/HTTP (or to ``exporter``); None when tracing is off.

    The OTLP exporter is imported only here, so a server without tracing never loads it.
    """
    if not settings.enabled:
        if settings.mode != "opentelemetry" and settings.level not in (None, "OFF"):
            logger.warning("tracing needs --trace-config mode=opentelemetry; Triton's trace mode is not supported")
        return None
    env = os.environ if environ is None else environ
    resource = Resource.create({})  # the SDK's attributes, OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    defaults: dict[str, str] = {}
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        defaults["service.name"] = SERVICE_NAME
    if "service.version" not in resource.attributes:
        defaults["service.version"] = __version__
    resource = resource.merge(Resource({**defaults, **settings.resource}))
    sampler = None  # the SDK reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
    if settings.rate is not None or not env.get("OTEL_TRACES_SAMPLER"):
        sampler = TritonSampler(1000 if settings.rate is None else settings.rate, settings.count)
    provider = TracerProvider(sampler=sampler, resource=resource)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.url)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=settings.bsp_max_queue_size,
            schedule_delay_millis=settings.bsp_schedule_delay,
            max_export_batch_size=settings.bsp_max_export_batch_size,
        )
    )
    where = settings.url or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    logger.info(
        "tracing: OpenTelemetry, OTLP/HTTP to %s, sampler %s", where or DEFAULT_URL, provider.sampler.get_description()
    )
    propagators = env.get("OTEL_PROPAGATORS", "tracecontext,baggage").replace(" ", "").split(",")
    return ServerTracing(
        provider, sampler, w3c="tracecontext" in propagators and len(set(propagators) - {"baggage"}) == 1
    )
