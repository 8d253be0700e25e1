"""logicd streams a decoupled model's responses to its caller as server-sent events (``Context.stream``), on a
real modelsvc over gRPC: one event per response in order, an error mid-stream as a last ``error`` event, an error
before the first response as problem+json, and a caller that disconnects cancels the model's stream (the model
sees ``is_cancelled()``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
from litestar.response import ServerSentEvent
from litestar.testing import TestClient

from logicd import Context, Service, create_app, load_config
from modelsvc.client import AsyncClient
from tests._edge_app import serve, service_yaml
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[1] / "data" / "edge_stream"


class Count(msgspec.Struct):
    n: int
    fail_at: int = -1
    delay_ms: int = 0


service = Service()


@service.post("/v1/count")
async def count(request: Count, ctx: Context) -> ServerSentEvent:
    inputs = {
        "N": np.array([request.n], np.int32),
        "FAIL_AT": np.array([request.fail_at], np.int32),
        "DELAY_MS": np.array([request.delay_ms], np.int32),
    }
    return await ctx.stream("countdown", inputs, render=lambda r: {"i": int(r["OUT"][0])})


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(logicd's base URL, the model service's gRPC URL, its HTTP URL)."""
    with ModelsvcProcess(REPO) as models:
        if httpx.get(f"{models.base}/v2/models/countdown/ready", timeout=5).status_code != 200:
            pytest.skip("this modelsvc does not load decoupled models")
        grpc_url = f"grpc://127.0.0.1:{models.grpc_port}"
        config = service_yaml(tmp_path_factory.mktemp("stream"), grpc_url, ["countdown"])
        with serve(service, config) as url:
            yield url, grpc_url, models.base


def _events(text: str) -> list[dict[str, Any]]:
    """Each event of an SSE body as {field: value}."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(":")
            fields[name] = value.strip()
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def test_every_response_is_one_event_in_order(servers: tuple[str, str, str]) -> None:
    answer = httpx.post(f"{servers[0]}/v1/count", json={"n": 5}, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = _events(answer.text)
    assert [e["data"] for e in events] == [{"i": i} for i in range(5)]
    assert [e["id"] for e in events] == [str(i) for i in range(5)]
    schema = httpx.get(f"{servers[0]}/schema/openapi.json", timeout=10)
    assert schema.status_code == 200
    assert "/v1/count" in schema.json()["paths"]


def test_an_error_mid_stream_is_a_last_error_event(servers: tuple[str, str, str]) -> None:
    events = _events(httpx.post(f"{servers[0]}/v1/count", json={"n": 9, "fail_at": 2}, timeout=30).text)
    assert [e["data"] for e in events[:2]] == [{"i": 0}, {"i": 1}]
    (error,) = events[2:]
    assert error["event"] == "error"
    assert error["data"]["status"] == 502
    assert "failed at response 2" in error["data"]["detail"]


def test_an_error_before_the_first_response_is_problem_json(servers: tuple[str, str, str]) -> None:
    answer = httpx.post(f"{servers[0]}/v1/count", json={"n": 3, "fail_at": 0}, timeout=30)
    assert answer.status_code == 502
    assert answer.headers["content-type"] == "application/problem+json"


def test_a_caller_that_disconnects_cancels_the_models_stream(servers: tuple[str, str, str]) -> None:
    base, grpc_url, _ = servers

    async def cancelled(client: AsyncClient) -> int:
        (answer,) = [r async for r in client.stream_infer("countdown", {"N": np.array([-1], np.int32)})]
        return int(answer["OUT"][0])

    async def main() -> None:
        async with AsyncClient(grpc_url) as models:
            before = await cancelled(models)
            async with (
                httpx.AsyncClient(timeout=30) as caller,
                caller.stream("POST", f"{base}/v1/count", json={"n": 1000, "delay_ms": 20}) as answer,
            ):
                seen = 0
                async for line in answer.aiter_lines():
                    seen += line.startswith("data:")
                    if seen == 2:
                        break  # leaving the block closes the connection
            end = time.monotonic() + 10
            while await cancelled(models) == before:
                assert time.monotonic() < end, "the model never saw is_cancelled()"
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_streaming_over_an_http_model_service_is_a_logged_500(
    servers: tuple[str, str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = service_yaml(tmp_path, servers[2], ["countdown"])
    with TestClient(create_app(service, load_config(config))) as client:
        answer = client.post("/v1/count", json={"n": 2})
    assert answer.status_code == 500
    assert "needs model_service.url: grpc://" in caplog.text


def test_the_readme_example_defines_its_routes() -> None:
    """The README's example of sequences and streams (the python block that calls ``ctx.stream``) defines a
    service whose routes are a sequence route and a streaming one."""
    import re

    from tests._server import ROOT

    blocks = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)]
    (block,) = [b for b in blocks if "ctx.stream(" in b] or [None]
    if block is None:
        pytest.skip("the README has no example of ctx.stream yet (docs merged by the lead)")
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    routes = {route.path: route for route in namespace["service"].routes}
    assert routes["/v1/generate"].response_type is ServerSentEvent
    assert set(routes) == {"/v1/summary", "/v1/generate"}
