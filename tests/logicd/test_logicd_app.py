"""The app factory: a Service and its service.yaml become a Litestar app with health, metrics, problem+json,
limits, auth and model calls, in embedded mode (in-process) and against a real model service."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
from litestar.testing import TestClient
from tokenizers.implementations import BertWordPieceTokenizer

from logicd import Context, Service, create_app, load_config
from logicd.text import mean_pool, softmax
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import HELD, identity_config

WORDS = [f"w{i}" for i in range(300)]


class EchoIn(msgspec.Struct):
    values: list[float]


class EchoOut(msgspec.Struct):
    values: list[float]


class DocsIn(msgspec.Struct):
    texts: list[str]


class DocsOut(msgspec.Struct):
    chunks: list[int]
    scores: list[list[float]]


@dataclasses.dataclass
class Pair:
    a: float
    b: float


@dataclasses.dataclass
class Sum:
    total: float


service = Service()


@service.post("/v1/sum")
async def add(request: Pair, ctx: Context) -> Sum:
    """Plain dataclasses work as request and response models too."""
    return Sum(total=request.a + request.b)


@service.post("/v1/echo")
async def echo(request: EchoIn, ctx: Context) -> EchoOut:
    """Echo 16 numbers through the identity model."""
    async with ctx.stage("model"):
        out = await ctx.model("identity").infer(INPUT0=[request.values])
    return EchoOut(values=out["OUTPUT0"][0].tolist())


@service.post("/v1/held")
async def held(request: EchoIn, ctx: Context) -> EchoOut:
    out = await ctx.model("held").infer(INPUT0=[request.values])
    return EchoOut(values=out["OUTPUT0"][0].tolist())


@service.post("/v1/score")
async def score(request: DocsIn, ctx: Context) -> DocsOut:
    ctx.check_texts(request.texts)
    async with ctx.stage("preprocess"):
        chunks = await ctx.chunk(request.texts)
    async with ctx.stage("model"):
        logits = await ctx.infer_chunks("token", chunks, "logits")
    pooled = mean_pool(logits, chunks.doc_index, chunks.token_counts, num_docs=len(request.texts))
    counts = np.bincount(np.asarray(chunks.doc_index), minlength=len(request.texts))
    return DocsOut(chunks=counts.tolist(), scores=softmax(pooled).tolist())


@pytest.fixture(scope="module")
def service_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("svc")
    repo = folder / "model_repository"
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "held", om.identity(), identity_config("held", extra=HELD))
    om.write_model(repo, "token", om.token_classifier(layers=1), _TOKEN_CONFIG)
    tok = folder / "tokenizer"
    tok.mkdir()
    vocab = tok / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(tok / "tokenizer.json"))
    return folder


_TOKEN_CONFIG = """name: "token"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
"""


def write_yaml(folder: Path, url: str, extra: str = "", timeout_s: float = 5.0) -> Path:
    path = folder / "service.yaml"
    path.write_text(f"""name: test-svc
service: test_service:service
model_service:
  url: {url}
  timeout_s: {timeout_s}
  retries: 0
  model_repository: ./model_repository
models: [identity, held, token]
tokenizer:
  path: ./tokenizer/tokenizer.json
chunking:
  max_tokens: 32
  stride: 4
limits:
  max_body_bytes: 20000
  max_text_chars: 5000
  max_documents: 4
{extra}""")
    return path


ROW = {"values": [float(i) for i in range(16)]}


def problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert "Traceback" not in response.text
    return body


def test_embedded_service_end_to_end(service_dir):
    app = create_app(service, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        assert client.get("/health/live").status_code == 200
        assert client.get("/health/ready").status_code == 200
        r = client.post("/v1/echo", json=ROW)
        assert r.status_code == 200
        assert r.json() == ROW
        long_doc = " ".join(WORDS[i % 300] for i in range(200))  # ~7 windows of 32 tokens
        r = client.post("/v1/score", json={"texts": [long_doc, "w1 w2 w3"]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["chunks"][0] >= 6
        assert body["chunks"][1] == 1
        assert all(abs(sum(s) - 1) < 1e-5 for s in body["scores"])
        metrics = client.get("/metrics").text
        assert 'logicd_requests_total{route="/v1/score",status="200"} 1.0' in metrics
        assert 'logicd_stage_duration_seconds_count{route="/v1/score",stage="preprocess"} 1.0' in metrics
        assert 'nv_inference_request_success{model="identity",version="1"}' in metrics  # the engine's own


def test_bad_input_is_problem_json_naming_the_field(service_dir):
    app = create_app(service, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        body = problem(client.post("/v1/echo", json={"values": "nope"}), 400)
        assert "values" in json.dumps(body)
        problem(client.post("/v1/echo", content=b"{not json", headers={"content-type": "application/json"}), 400)
        assert problem(client.post("/v1/score", json={"texts": ["  "]}), 422)["field"] == "texts[0]"
        assert problem(client.post("/v1/score", json={"texts": []}), 422)["field"] == "texts"
        assert "at most 4" in problem(client.post("/v1/score", json={"texts": ["w1"] * 5}), 422)["detail"]
        assert problem(client.post("/v1/score", json={"texts": ["w1 " * 2000]}), 422)["field"] == "texts[0]"
        problem(client.post("/v1/score", json={"texts": ["w1 " * 8000]}), 413)  # over max_body_bytes
        body = problem(client.post("/v1/echo", json={"values": [1.0] * 17}), 422)  # the model refuses the shape
        assert "the model refused the input" in body["detail"]
        assert client.post("/v1/echo", json=ROW).status_code == 200  # still serving


def test_model_service_down_then_back(service_dir):
    model = ModelsvcProcess(service_dir / "model_repository").start().wait_ready()
    try:
        app = create_app(service, load_config(write_yaml(service_dir, f"http://{model.url}")))
        with TestClient(app) as client:
            assert client.post("/v1/echo", json=ROW).json() == ROW
            model.terminate()
            r = client.post("/v1/echo", json=ROW)
            body = problem(r, 503)
            assert r.headers["retry-after"] == "1"
            assert "unavailable" in body["detail"]
            assert client.get("/health/ready").status_code == 503
            again = ModelsvcProcess(service_dir / "model_repository")
            again.http_port, again.url, again.base = model.http_port, model.url, model.base
            model = again.start().wait_ready()
            deadline = time.monotonic() + 20
            while client.get("/health/ready").status_code != 200:
                assert time.monotonic() < deadline, "the service did not recover"
                time.sleep(0.1)
            assert client.post("/v1/echo", json=ROW).json() == ROW
    finally:
        model.terminate()


def test_slow_model_is_504(service_dir):
    app = create_app(service, load_config(write_yaml(service_dir, "embedded", timeout_s=0.5)))
    with TestClient(app) as client:
        t0 = time.monotonic()
        body = problem(client.post("/v1/held", json=ROW), 504)  # 'held' waits 60 s to fill a batch
        assert time.monotonic() - t0 < 5
        assert "in time" in body["detail"]


def test_api_key_guards_service_routes_not_health(service_dir):
    auth = "auth:\n  mode: api_key\n  api_keys: [s3cret]\n"
    app = create_app(service, load_config(write_yaml(service_dir, "embedded", extra=auth)))
    with TestClient(app) as client:
        problem(client.post("/v1/echo", json=ROW), 401)
        problem(client.post("/v1/echo", json=ROW, headers={"x-api-key": "wrong"}), 401)
        assert client.post("/v1/echo", json=ROW, headers={"x-api-key": "s3cret"}).status_code == 200
        assert client.get("/health/ready").status_code == 200
        assert client.get("/metrics").status_code == 200


def test_openapi_schema_shows_the_models(service_dir):
    app = create_app(service, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        schema = client.get("/schema/openapi.json").json()
        assert "/v1/echo" in schema["paths"]
        assert "EchoIn" in json.dumps(schema["components"])


def test_one_trace_from_the_request_through_its_stages_into_the_model_call(service_dir, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import logicd._app
    from modelsvc.client import _tracing as client_tracing

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(logicd._app, "_tracer", provider.get_tracer("logicd"))
    monkeypatch.setattr(client_tracing, "_TRACER", provider.get_tracer("modelsvc.client"))
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    app = create_app(service, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        r = client.post("/v1/echo", json=ROW, headers={"traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"})
        assert r.status_code == 200
    provider.shutdown()
    spans = {s.name: s for s in memory.get_finished_spans()}
    request, stage, call = spans["POST /v1/echo"], spans["model"], spans["infer identity"]
    assert f"{request.context.trace_id:032x}" == caller_trace  # the caller's trace continues
    assert stage.parent.span_id == request.context.span_id
    assert call.parent.span_id == stage.context.span_id  # the model call nests under its stage
    assert call.context.trace_id == request.context.trace_id


def test_dataclass_models_are_validated_and_documented(service_dir):
    app = create_app(service, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        assert client.post("/v1/sum", json={"a": 1.5, "b": 2}).json() == {"total": 3.5}
        assert "b" in json.dumps(problem(client.post("/v1/sum", json={"a": 1.5}), 400))
        assert "Pair" in json.dumps(client.get("/schema/openapi.json").json()["components"])


def test_bearer_tokens(service_dir):
    auth = "auth:\n  mode: bearer\n  tokens: [t0ken]\n"
    app = create_app(service, load_config(write_yaml(service_dir, "embedded", extra=auth)))
    with TestClient(app) as client:
        r = client.post("/v1/echo", json=ROW)
        problem(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/echo", json=ROW, headers={"authorization": "Bearer t0ken"}).status_code == 200
        assert client.get("/docs").status_code == 200  # docs stay open


def test_requests_reconnect_when_the_model_service_comes_up_after_the_app(service_dir):
    """No readiness probe needed: a request finds the model service once it is there."""
    model = ModelsvcProcess(service_dir / "model_repository")  # its ports are chosen, nothing listens yet
    app = create_app(service, load_config(write_yaml(service_dir, f"http://{model.url}")))
    try:
        with TestClient(app) as client:
            problem(client.post("/v1/echo", json=ROW), 503)
            model.start().wait_ready()
            deadline = time.monotonic() + 20
            while (r := client.post("/v1/echo", json=ROW)).status_code != 200:
                assert r.status_code == 503, r.text
                assert time.monotonic() - deadline < 0, "requests never reconnected"
                time.sleep(0.1)
            assert r.json() == ROW
    finally:
        model.terminate()


def test_startup_hooks_finish_before_requests_and_do_not_run_twice(service_dir):
    from modelsvc.client import ServerUnavailable

    hooked = Service()
    calls = {"first": 0, "second": 0}

    @hooked.on_startup
    async def first(ctx: Context) -> None:
        calls["first"] += 1
        ctx.state["items"] = [*ctx.state.get("items", []), "first"]

    @hooked.on_startup
    async def second(ctx: Context) -> None:
        calls["second"] += 1
        if calls["second"] == 1:
            raise ServerUnavailable("not yet")  # fails once, as a model call might while its service warms up
        await ctx.model("identity").infer(INPUT0=[ROW["values"]])  # hooks can call the models

    @hooked.post("/v1/state")
    async def state(request: EchoIn, ctx: Context) -> EchoOut:
        ctx.model("identity")
        return EchoOut(values=[float(len(ctx.state["items"]))])

    app = create_app(hooked, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        assert calls == {"first": 1, "second": 1}
        assert client.post("/v1/state", json=ROW).json() == {"values": [1.0]}  # connected on this request
        assert calls == {"first": 1, "second": 2}  # the first hook did not run again
        assert client.get("/health/ready").status_code == 200


def test_service_errors_keep_their_title_and_odd_statuses(service_dir):
    from logicd import ServiceError

    odd = Service()

    @odd.post("/v1/teapot")
    async def teapot(request: EchoIn, ctx: Context) -> EchoOut:
        raise ServiceError(418, "short and stout", title="Teapot")

    @odd.post("/v1/odd")
    async def odd_status(request: EchoIn, ctx: Context) -> EchoOut:
        raise ServiceError(499, "an unusual status", field="values")

    @odd.post("/v1/empty")
    async def empty(request: DocsIn, ctx: Context) -> EchoOut:
        chunks = await ctx.chunk(request.texts)
        return EchoOut(values=(await ctx.infer_chunks("token", chunks, "logits")).tolist())

    app = create_app(odd, load_config(write_yaml(service_dir, "embedded")))
    with TestClient(app) as client:
        assert problem(client.post("/v1/teapot", json=ROW), 418)["title"] == "Teapot"
        body = problem(client.post("/v1/odd", json=ROW), 499)
        assert (body["title"], body["field"]) == ("Client Error", "values")
        assert client.post("/v1/empty", json={"texts": []}).json() == {"values": []}  # no model call, no error
