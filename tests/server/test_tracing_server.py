"""Server tracing: ``--trace-config`` parsing, spans recorded in-process, and a real server exporting OTLP.

The batching model takes exactly ``ROWS`` rows and waits a minute for them, so concurrent requests form one
batch because they fill it, never because a timer ran out: nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from modelsvc._cli import _parser
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, InferEndpoint, ModelManager, ServeOptions
from modelsvc.server.observe._tracing import TraceConfigError, TraceSettings, parse_trace_config, start_tracing
from modelsvc.tools.onnx_models import identity, write_model
from tests._server import ModelsvcProcess, free_port

ROWS = 3
TRIO = f"""name: "trio"
platform: "onnxruntime_onnx"
max_batch_size: {ROWS}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 60000000 }}
"""
SOLO = TRIO.replace('"trio"', '"solo"').replace(" max_queue_delay_microseconds: 60000000 ", " ")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tracing_repo")
    write_model(repo, "trio", identity(), TRIO)
    write_model(repo, "solo", identity(), SOLO)
    return repo


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def infer_body(request_id: str) -> bytes:
    inputs = [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]
    return json.dumps({"id": request_id, "inputs": inputs}).encode()


# -- flags ---------------------------------------------------------------------------------------------


def test_trace_config_flags_parse_like_tritonserver() -> None:
    settings = parse_trace_config(
        [
            "mode=opentelemetry",
            "level=TIMESTAMPS",
            "rate=10",
            "count=5",
            "opentelemetry,url=collector:4318/v1/traces",
            "opentelemetry,resource=service.name=embedder",
            "opentelemetry,resource=deployment.environment=prod",
            "opentelemetry,bsp_schedule_delay=200",
            "triton,file=/tmp/trace.json",  # Triton's own trace files: ignored with a warning
        ]
    )
    assert settings.enabled
    assert (settings.rate, settings.count, settings.bsp_schedule_delay) == (10, 5, 200)
    assert settings.url == "http://collector:4318/v1/traces"
    assert settings.resource == {"service.name": "embedder", "deployment.environment": "prod"}
    assert not parse_trace_config(["mode=opentelemetry", "level=OFF"]).enabled
    assert not parse_trace_config(["level=TIMESTAMPS"]).enabled  # Triton's own mode: not supported
    assert not parse_trace_config([]).enabled


@pytest.mark.parametrize(
    "flag",
    ["mode=jaeger", "level=TENSORS", "rate=-1", "rate=often", "colour=blue", "opentelemetry,port=1", "zipkin,url=x"],
)
def test_bad_trace_config_is_refused(flag: str) -> None:
    with pytest.raises(TraceConfigError, match="--trace-config"):
        parse_trace_config([flag])


def test_tracing_is_off_by_default() -> None:
    args = _parser().parse_args(["serve", "--model-repository", "."])
    assert args.trace_config == []
    assert not ServeOptions(model_repository=Path(".")).trace.enabled
    assert start_tracing(TraceSettings()) is None


# -- in-process: the spans of one batch ---------------------------------------------------------------


class Harness:
    def __init__(self, endpoint: InferEndpoint, exporter: InMemorySpanExporter) -> None:
        self.endpoint = endpoint
        self.exporter = exporter

    def spans(self) -> list[ReadableSpan]:
        tracing = self.endpoint.dataplane.tracing
        assert tracing is not None
        tracing.provider.force_flush()
        return list(self.exporter.get_finished_spans())


@pytest.fixture
async def harness(repository: Path) -> Harness:
    models = ModelManager(ModelRepository(repository))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    exporter = InMemorySpanExporter()
    dataplane.tracing = start_tracing(TraceSettings(mode="opentelemetry", rate=0), exporter)
    yield Harness(InferEndpoint(dataplane), exporter)
    dataplane.tracing.shutdown()
    await models.close()


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id}


async def test_a_batch_of_traced_requests(harness: Harness) -> None:
    parents = [(0xABC0 + i, 0x10 + i) for i in range(ROWS)]
    replies = await asyncio.gather(
        *(
            harness.endpoint.handle("trio", None, [(b"traceparent", traceparent(t, s).encode())], infer_body(f"r{i}"))
            for i, (t, s) in enumerate(parents)
        )
    )
    assert [r.status for r in replies] == [200] * ROWS
    spans = harness.spans()
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert sorted((s.context.trace_id, s.parent.span_id) for s in servers) == parents
    batches = [s for s in spans if s.name == "batch trio"]
    assert len(batches) == 1
    (batch,) = batches
    assert batch.attributes is not None
    assert (batch.attributes["modelsvc.batch_size"], batch.attributes["modelsvc.batch.requests"]) == (ROWS, ROWS)
    assert {link.context.span_id for link in batch.links} == {s.context.span_id for s in servers}
    for server in servers:
        assert server.attributes is not None
        assert server.name == "infer trio"
        assert server.attributes["modelsvc.model.version"] == "1"
        assert server.attributes["modelsvc.outcome"] == "ok"
        assert server.attributes["http.response.status_code"] == 200
        assert str(server.attributes["modelsvc.request.id"]).startswith("r")
        kids = children(spans, server)
        queue, compute = kids["queue"], kids["compute"]
        assert compute.attributes is not None
        assert compute.attributes["modelsvc.batch_size"] == ROWS
        assert [link.context.span_id for link in compute.links] == [batch.context.span_id]
        assert queue.end_time is not None
        assert compute.start_time is not None
        assert queue.end_time <= compute.start_time
    # the batch lives in the trace of its first request, under that request's server span
    assert batch.parent is not None
    assert batch.parent.span_id in {s.context.span_id for s in servers}


async def test_failed_and_unsampled_requests(harness: Harness) -> None:
    bad = json.dumps({"inputs": [{"name": "NOPE", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}).encode()
    header = [(b"traceparent", traceparent(0xBAD, 0x1).encode())]
    assert (await harness.endpoint.handle("solo", None, header, bad)).status == 400
    unsampled = [(b"traceparent", traceparent(0xDEF, 0x2, sampled=False).encode())]
    assert (await harness.endpoint.handle("solo", None, unsampled, infer_body("u"))).status == 200
    # rate=0: a request without trace context is not traced
    assert (await harness.endpoint.handle("solo", None, [], infer_body("plain"))).status == 200
    spans = harness.spans()
    assert len(spans) == 1
    (server,) = spans
    assert server.attributes is not None
    assert server.attributes["modelsvc.outcome"] == "error"
    assert server.attributes["http.response.status_code"] == 400
    assert server.status.status_code is StatusCode.ERROR


async def test_rate_traces_every_nth_request_without_context(repository: Path) -> None:
    models = ModelManager(ModelRepository(repository))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    exporter = InMemorySpanExporter()
    tracing = dataplane.tracing = start_tracing(TraceSettings(mode="opentelemetry", rate=3), exporter)
    assert tracing is not None
    endpoint = InferEndpoint(dataplane)
    for i in range(9):
        assert (await endpoint.handle("solo", None, [], infer_body(str(i)))).status == 200
    tracing.shutdown()
    await models.close()
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(servers) == 3
    assert all(s.parent is None for s in servers)  # roots: no caller context
    assert {s.name for s in exporter.get_finished_spans()} == {"infer solo", "queue", "compute", "batch solo"}


async def test_overhead_per_request_off_and_on(repository: Path) -> None:
    """Printed, not asserted: CPU per request of InferEndpoint.handle with tracing off, on but not sampled,
    and on and sampled (in-memory exporter)."""
    models = ModelManager(ModelRepository(repository))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    endpoint = InferEndpoint(dataplane)
    body = infer_body("x")
    header = [(b"traceparent", traceparent(0x1, 0x2).encode())]
    results = {}
    for label, rate, headers in (("off", None, []), ("on, not sampled", 0, []), ("on, sampled", 0, header)):
        settings = TraceSettings(mode="opentelemetry", rate=rate)
        dataplane.tracing = None if rate is None else start_tracing(settings, InMemorySpanExporter())
        best = float("inf")
        for _ in range(3):
            c0 = time.process_time()
            for _ in range(300):
                await endpoint.handle("solo", None, headers, body)
            best = min(best, (time.process_time() - c0) / 300)
        results[label] = best * 1e6
        if dataplane.tracing is not None:
            dataplane.tracing.shutdown()
    await models.close()
    print("\nCPU us/request (JSON body, solo model):", {k: round(v, 1) for k, v in results.items()})


# -- a real server exporting OTLP/HTTP to a receiver ------------------------------------------------


class OtlpReceiver:
    """A tiny OTLP/HTTP trace receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.port = free_port()
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                received.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def spans(self) -> list[tuple[dict[str, object], object]]:
        """(resource attributes, span) for every span received."""
        out = []
        for request in self.requests:
            for rs in request.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                out += [(resource, span) for ss in rs.scope_spans for span in ss.spans]
        return out

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def attrs(span: object) -> dict[str, object]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def send_concurrently(base: str, model: str, traceparents: list[str]) -> list[int]:
    statuses: list[int] = [0] * len(traceparents)

    def one(i: int) -> None:
        statuses[i] = httpx.post(
            f"{base}/v2/models/{model}/infer",
            content=infer_body(f"req-{i}"),
            headers={"traceparent": traceparents[i]},
            timeout=30,
        ).status_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(traceparents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


@pytest.mark.integration
@pytest.mark.parametrize("workers", ["0", "2"], ids=["one process", "two ingest workers"])
def test_server_exports_one_trace_per_request_with_the_batch(
    repository: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, workers: str
) -> None:
    """With ingest workers, a worker carries each request's W3C context to the engine, which traces it: the same
    trace as one process gives."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "modelsvc-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # spans arrive only through the flush at SIGTERM
    server = ModelsvcProcess(
        repository,
        "--workers",
        workers,
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        f"opentelemetry,url={receiver.url}",
        "--trace-config",
        "opentelemetry,resource=deployment.environment=test",
    )
    parents = [(0x5EED0000 + i, 0xC0FFEE00 + i) for i in range(ROWS)]
    with server:
        statuses = send_concurrently(server.base, "trio", [traceparent(t, s) for t, s in parents])
        assert statuses == [200] * ROWS
        server.terminate()
        assert server.proc is not None
        assert server.proc.returncode == 0, server.log()
    received = receiver.spans()
    assert received, f"no spans exported:\n{server.log()}"
    resource = received[0][0]
    assert resource["service.name"] == "modelsvc-under-test"
    assert resource["deployment.environment"] == "test"
    spans = [s for _, s in received]
    servers = [s for s in spans if s.name == "infer trio"]
    assert (
        sorted((int.from_bytes(s.trace_id, "big"), int.from_bytes(s.parent_span_id, "big")) for s in servers) == parents
    )
    server_ids = {s.span_id for s in servers}
    (batch,) = [s for s in spans if s.name == "batch trio"]
    assert attrs(batch)["modelsvc.batch_size"] == ROWS
    assert {link.span_id for link in batch.links} == server_ids
    for s in servers:
        assert attrs(s)["modelsvc.outcome"] == "ok"
        kids = {k.name: k for k in spans if k.parent_span_id == s.span_id}
        assert {"queue", "compute"} <= set(kids)
        assert kids["queue"].trace_id == s.trace_id
        assert attrs(kids["compute"])["modelsvc.batch_size"] == ROWS
        assert [link.span_id for link in kids["compute"].links] == [batch.span_id]


@pytest.mark.integration
def test_default_server_exports_nothing(
    repository: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # everything an SDK would need to export is in the environment: modelsvc still sets up no tracer
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    with ModelsvcProcess(repository) as server:
        assert send_concurrently(server.base, "solo", [traceparent(0x1, 0x2)]) == [200]
        server.terminate()
        assert server.proc is not None
        assert server.proc.returncode == 0
        assert "tracing" not in server.log()
    assert receiver.requests == []


def test_export_batch_larger_than_queue_is_refused() -> None:
    flags = ["opentelemetry,bsp_max_queue_size=10", "opentelemetry,bsp_max_export_batch_size=20"]
    with pytest.raises(TraceConfigError, match="bsp_max_export_batch_size"):
        parse_trace_config(flags)


class BrokenTrace:
    def enqueued(self, version: str) -> None:
        pass

    def batch_started(self, batch: object, rows: int) -> object:
        raise RuntimeError("tracing bug")


async def test_a_failing_trace_hook_does_not_lose_the_request(harness: Harness) -> None:
    from modelsvc.protocol import decode_infer_request

    request = decode_infer_request(infer_body("x"), None)
    response = await harness.endpoint.dataplane.infer("solo", None, request, BrokenTrace())
    assert response.outputs[0].data.shape == (1, 16)
