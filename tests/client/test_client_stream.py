"""The typed client's streamed responses over gRPC ModelStreamInfer, on a real modelsvc: a model that is not
decoupled streams its one final answer; a decoupled one its N responses in order (many streams at once); an
error sent mid-stream raises after the responses before it; leaving the loop early cancels the stream and the
model sees ``is_cancelled()``; one span per stream; HTTP refuses with ``StreamingUnsupported``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loadtests.harness._servers import free_port
from modelsvc.client import AsyncClient, Client, InvalidInput, RetryPolicy, StreamError, StreamingUnsupported, Timeout
from modelsvc.client import _tracing as tracing_module
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[1] / "data" / "edge_stream"


@pytest.fixture(scope="module")
def server() -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(REPO) as process:
        yield process


@pytest.fixture
def grpc_url(server: ModelsvcProcess) -> str:
    return f"grpc://127.0.0.1:{server.grpc_port}"


@pytest.fixture
def decoupled(server: ModelsvcProcess, grpc_url: str) -> str:
    """The gRPC URL, once the decoupled model has loaded (skips where the server cannot load decoupled models)."""
    import httpx

    if httpx.get(f"{server.base}/v2/models/countdown/ready", timeout=5).status_code != 200:
        pytest.skip("this modelsvc does not load decoupled models")
    return grpc_url


def _n(n: int, fail_at: int = -1, delay_ms: int = 0) -> dict[str, Any]:
    return {
        "N": np.array([n], np.int32),
        "FAIL_AT": np.array([fail_at], np.int32),
        "DELAY_MS": np.array([delay_ms], np.int32),
    }


def test_http_refuses_streaming(server: ModelsvcProcess) -> None:
    async def main() -> None:
        async with AsyncClient(server.base) as client:
            with pytest.raises(StreamingUnsupported, match="grpc://"):
                client.stream_infer("square", {"IN": np.ones(2, np.float32)})

    asyncio.run(main())


def test_a_model_that_is_not_decoupled_streams_its_one_answer(grpc_url: str) -> None:
    async def main() -> None:
        async with AsyncClient(grpc_url) as client:
            results = [r async for r in client.stream_infer("square", {"IN": np.array([2.0, 3.0], np.float32)})]
            assert [r["OUT"].tolist() for r in results] == [[4.0, 9.0]]
            with pytest.raises((StreamError, InvalidInput), match=r"NOPE"):
                async for _ in client.stream_infer("square", {"NOPE": np.ones(1, np.float32)}):
                    pass

    asyncio.run(main())


def test_one_span_per_stream(grpc_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing_module, "_TRACER", provider.get_tracer("modelsvc.client"))

    async def main() -> None:
        async with AsyncClient(grpc_url) as client:
            async for _ in client.stream_infer("square", {"IN": np.ones(1, np.float32)}):
                pass

    asyncio.run(main())
    (span,) = memory.get_finished_spans()
    assert span.name == "infer square"
    assert span.attributes is not None
    assert span.attributes["rpc.method"] == "ModelStreamInfer"
    assert span.attributes["modelsvc.responses"] == 1
    assert span.attributes["modelsvc.outcome"] == "ok"
    provider.shutdown()


def test_decoupled_responses_in_order_many_streams_at_once(decoupled: str) -> None:
    async def main() -> None:
        async with AsyncClient(decoupled) as client:

            async def one(n: int) -> list[int]:
                return [int(r["OUT"][0]) async for r in client.stream_infer("countdown", _n(n))]

            got = await asyncio.gather(*(one(n) for n in range(12)))
            assert got == [list(range(n)) for n in range(12)]  # n = 0: only the empty final response

    asyncio.run(main())


def test_an_error_mid_stream_raises_after_the_responses_before_it(decoupled: str) -> None:
    async def main() -> None:
        async with AsyncClient(decoupled) as client:
            seen: list[int] = []

            async def read() -> None:
                async for r in client.stream_infer("countdown", _n(10, fail_at=3)):
                    seen.append(int(r["OUT"][0]))

            with pytest.raises(StreamError, match="failed at response 3"):
                await read()
            assert seen == [0, 1, 2]

    asyncio.run(main())


def test_leaving_the_loop_cancels_the_stream_and_the_model_sees_it(decoupled: str) -> None:
    async def main() -> None:
        async with AsyncClient(decoupled) as client:

            async def cancelled() -> int:
                (answer,) = [r async for r in client.stream_infer("countdown", _n(-1))]
                return int(answer["OUT"][0])

            before = await cancelled()
            async for r in client.stream_infer("countdown", _n(1000, delay_ms=20)):
                if int(r["OUT"][0]) == 2:
                    break
            end = time.monotonic() + 10
            while await cancelled() == before:
                assert time.monotonic() < end, "the model never saw is_cancelled()"
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_over_replicas_a_stream_that_cannot_connect_opens_again_on_another(grpc_url: str) -> None:
    dead = f"grpc://127.0.0.1:{free_port()}"

    async def main() -> None:
        retry = RetryPolicy(attempts=3, backoff_s=0.001, max_backoff_s=0.002)
        async with AsyncClient([dead, grpc_url], retry=retry) as client:
            for _ in range(4):
                results = [r async for r in client.stream_infer("square", {"IN": np.array([3.0], np.float32)})]
                assert [r["OUT"].tolist() for r in results] == [[9.0]]
            states = {s.url: s for s in client.replicas()}
            assert states[dead].ejected
            assert [s.outstanding for s in states.values()] == [0, 0]

    asyncio.run(main())


def test_the_timeout_bounds_the_whole_stream(decoupled: str) -> None:
    async def main() -> None:
        async with AsyncClient(decoupled) as client:
            seen: list[int] = []

            async def read() -> None:
                async for r in client.stream_infer("countdown", _n(100, delay_ms=20), timeout=0.3):
                    seen.append(int(r["OUT"][0]))

            with pytest.raises(Timeout):
                await read()
            assert 3 <= len(seen) < 100

    asyncio.run(main())


def test_the_sync_client_streams_too(server: ModelsvcProcess, decoupled: str) -> None:
    with Client(server.base) as http, pytest.raises(StreamingUnsupported):
        http.stream_infer("countdown", _n(1))
    with Client(decoupled) as client:
        assert [int(r["OUT"][0]) for r in client.stream_infer("countdown", _n(6))] == list(range(6))

        def cancelled() -> int:
            (answer,) = list(client.stream_infer("countdown", _n(-1)))
            return int(answer["OUT"][0])

        before = cancelled()
        with client.stream_infer("countdown", _n(1000, delay_ms=20)) as responses:
            assert int(next(responses)["OUT"][0]) == 0
        end = time.monotonic() + 10
        while cancelled() == before:
            assert time.monotonic() < end, "the model never saw is_cancelled()"
            time.sleep(0.05)
