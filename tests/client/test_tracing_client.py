"""Client spans: attributes, W3C injection, failures, the no-provider fast path, and one trace from the
client's span into the server's batch (a real server exporting OTLP to a receiver in the test)."""

from __future__ import annotations

import re
import subprocess
import sys
import timeit
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from modelsvc.client import _tracing
from modelsvc.client._tracing import client_span
from tests._server import ROOT, ModelsvcProcess
from tests.server.test_tracing_server import ROWS, OtlpReceiver

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
"""W3C traceparent: version 00, trace id, parent id, flags (bit 0: sampled; the SDK may also set bit 1, random)."""


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Client spans into memory, without touching the process-wide tracer provider."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(_tracing, "_TRACER", provider.get_tracer("modelsvc.client"))
    yield memory
    provider.shutdown()


def test_client_span_records_the_call(exporter: InMemorySpanExporter) -> None:
    with client_span("embedder", "2", transport="http", server="model-svc:8000") as span:
        headers: dict[str, str] = {}
        span.inject(headers)
        span.record(batch_size=4, bytes_sent=1200, bytes_received=800)
    (recorded,) = exporter.get_finished_spans()
    assert recorded.name == "infer embedder"
    assert recorded.kind is SpanKind.CLIENT
    assert dict(recorded.attributes or {}) == {
        "modelsvc.model.name": "embedder",
        "modelsvc.model.version": "2",
        "modelsvc.transport": "http",
        "rpc.system": "kserve_v2",
        "rpc.method": "ModelInfer",
        "server.address": "model-svc",
        "server.port": 8000,
        "modelsvc.batch_size": 4,
        "modelsvc.request.bytes": 1200,
        "modelsvc.response.bytes": 800,
        "modelsvc.outcome": "ok",
    }
    match = TRACEPARENT.match(headers["traceparent"])
    assert match is not None, headers
    assert int(match[1], 16) == recorded.context.trace_id
    assert int(match[2], 16) == recorded.context.span_id
    assert int(match[3], 16) & 1 == 1


def test_client_span_is_a_child_of_the_current_span(exporter: InMemorySpanExporter) -> None:
    tracer = _tracing._TRACER
    with (
        tracer.start_as_current_span("logic request") as outer,
        client_span("m", None, transport="grpc", server="grpc://10.0.0.1:8001"),
    ):
        pass
    (inner,) = [s for s in exporter.get_finished_spans() if s.name == "infer m"]
    assert inner.parent is not None
    assert inner.parent.span_id == outer.get_span_context().span_id
    assert inner.attributes is not None
    assert inner.attributes["server.address"] == "10.0.0.1"
    assert "modelsvc.model.version" not in inner.attributes


def test_failures_mark_the_span(exporter: InMemorySpanExporter) -> None:
    with client_span("m", None, transport="http", server="h:1") as span:
        span.fail(TimeoutError("no answer in 1s"))
    with pytest.raises(ConnectionError), client_span("m", None, transport="http", server="h:1"):
        raise ConnectionError("refused")
    failed = exporter.get_finished_spans()
    assert [s.attributes["error.type"] for s in failed if s.attributes] == ["TimeoutError", "ConnectionError"]
    for s in failed:
        assert s.attributes is not None
        assert s.attributes["modelsvc.outcome"] == "error"
        assert s.status.status_code is StatusCode.ERROR


def test_sampled_out_span_still_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    monkeypatch.setattr(_tracing, "_TRACER", provider.get_tracer("modelsvc.client"))
    with client_span("m", None, transport="http", server="h:1") as span:
        headers: dict[str, str] = {}
        span.inject(headers)
    match = TRACEPARENT.match(headers["traceparent"])
    assert match is not None
    assert int(match[3], 16) & 1 == 0  # not sampled: the server follows the caller's decision


def test_without_a_provider_everything_is_a_cheap_noop() -> None:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a tracer provider was set in this process")

    def call() -> None:
        with client_span("m", None, transport="http", server="h:1") as span:
            headers: dict[str, str] = {}
            span.inject(headers)
            span.record(batch_size=1, bytes_sent=1, bytes_received=1)

    with client_span("m", None, transport="http", server="h:1") as span:
        headers: dict[str, str] = {}
        span.inject(headers)
    assert headers == {}
    assert span is client_span("m", None, transport="http", server="h:1")  # one shared no-op
    n = 20_000
    per_call = min(timeit.repeat(call, number=n, repeat=3)) / n
    print(f"\nclient_span with no tracer provider: {per_call * 1e6:.2f} us per call")


def test_global_provider_set_after_import() -> None:
    """The client follows the process-wide provider, also one set after modelsvc.client was imported."""
    script = """
from modelsvc.client._tracing import client_span
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
with client_span("m", "1", transport="http", server="h:1") as span:
    headers = {}
    span.inject(headers)
assert "traceparent" in headers, headers
print([s.name for s in memory.get_finished_spans()])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['infer m']"


@pytest.mark.integration
def test_one_trace_from_the_client_call_to_the_batch(
    exporter: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelsvc.client import Client
    from modelsvc.tools.onnx_models import identity, write_model
    from tests.server.test_tracing_server import TRIO

    write_model(tmp_path, "trio", identity(), TRIO)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # spans arrive through the flush at SIGTERM
    with OtlpReceiver() as receiver:
        server = ModelsvcProcess(
            tmp_path, "--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={receiver.url}"
        )
        with server:
            tracer = _tracing._TRACER
            with tracer.start_as_current_span("logic request", kind=SpanKind.SERVER), Client(server.url) as client:
                out = client.infer("trio", {"INPUT0": np.ones((ROWS, 16), np.float32)})
            assert out["OUTPUT0"].shape == (ROWS, 16)
            server.terminate()
        spans = [s for _, s in receiver.spans()]
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "infer trio"]
    assert call.attributes is not None
    assert call.attributes["modelsvc.batch_size"] == ROWS
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"infer trio", "queue", "compute", "batch trio"}, server.log()
    served = by_name["infer trio"]
    assert int.from_bytes(served.trace_id, "big") == call.context.trace_id
    assert int.from_bytes(served.parent_span_id, "big") == call.context.span_id
    for child in ("queue", "compute", "batch trio"):
        assert by_name[child].trace_id == served.trace_id
