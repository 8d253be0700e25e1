"""The worker's HTTP proxy (``_proxy.http_proxy``) on its own, against a stand-in for the engine's Unix-socket door."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from tritonclient.grpc import service_pb2_grpc

from modelsvc.server.ingest._proxy import http_proxy
from modelsvc.tools import onnx_models as om
from tests._grpc import FP32_ROW, ONE, raw_request, target
from tests._server import ModelsvcProcess
from tests.conftest import identity_config


async def _call(app: Any, path: str) -> int:
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": "GET", "raw_path": path.encode(), "query_string": b"", "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


async def test_slow_forwarded_calls_do_not_hold_up_the_others(tmp_path: Path) -> None:
    """More forwarded calls at once than httpx's default pool (100) may wait in the engine (model loads): a health
    check beside them is answered at once, as one process answers it (it has no such pool)."""
    release = asyncio.Event()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b" /slow " in head:
            await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    path = str(tmp_path / "http.sock")
    server = await asyncio.start_unix_server(engine, path)
    app = http_proxy(path)
    try:
        slow = [asyncio.ensure_future(_call(app, "/slow")) for _ in range(110)]
        await asyncio.sleep(0.5)
        assert await asyncio.wait_for(_call(app, "/v2/health/live"), 5) == 200
        release.set()
        assert await asyncio.gather(*slow) == [200] * 110
    finally:
        release.set()
        await app.client.aclose()  # type: ignore[attr-defined]
        server.close()


STREAMS = 150


@pytest.mark.integration
async def test_a_worker_forwards_more_streams_than_one_connections_limit(tmp_path: Path) -> None:
    """A worker forwards every client's ModelStreamInfer over its one connection to the engine's door: that door must
    not cap it at the per-connection 100 streams (--grpc-max-concurrent-streams) a client connection has, or the
    101st open stream through a worker waits for one of the others to end (with open sequence streams: for ever)."""
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    with ModelsvcProcess(tmp_path, "--workers", "1") as server:
        # three connections (no shared subchannel), 50 streams each: each under the public door's cap
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(target(server), options=options) for _ in range(3)]
        release = asyncio.Event()
        calls = []
        for n in range(STREAMS):

            async def requests(n: int = n) -> Any:
                yield raw_request("identity", ONE, [FP32_ROW], id=f"s{n}")
                await release.wait()

            calls.append(service_pb2_grpc.GRPCInferenceServiceStub(channels[n % 3]).ModelStreamInfer(requests()))
        try:
            answers = await asyncio.wait_for(asyncio.gather(*(call.read() for call in calls)), 20)
            assert sorted(a.infer_response.id for a in answers) == sorted(f"s{n}" for n in range(STREAMS))
        finally:
            release.set()
            for channel in channels:
                await channel.close()
