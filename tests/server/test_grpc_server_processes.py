"""The v2 gRPC endpoint on servers of their own: a small message limit, a model that does not load, gRPC switched
off, a port in use, the message-size flag, the drain on SIGTERM, and grpcio's engine from the command line.
What they share: tests/_grpc.py.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelsvc._cli import _parser
from modelsvc.tools import onnx_models as om
from tests._grpc import (
    FP32_ROW,
    ONE,
    ROW,
    WAIT,
    good,
    infer_input,
    metric,
    raw_request,
    status_of,
    target,
    until,
)
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration


# -- servers of their own -----------------------------------------------------------------------------------


class LiveProcess(ModelsvcProcess):
    """Ready when live: its repository holds a model that does not load."""

    ready_path = "/v2/health/live"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("grpc_small")
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "broken", om.identity(), 'name: "broken"\nmax_batch_size: 8\ninput oops\n')
    flags = ("--grpc-address", "127.0.0.1", "--grpc-max-message-size", str(1024 * 1024), "--exit-on-error", "false")
    with LiveProcess(repo, *flags) as proc:
        yield proc


def test_message_over_the_limit_is_resource_exhausted(small: ModelsvcProcess) -> None:
    c = grpcclient.InferenceServerClient(target(small))
    try:
        big = np.zeros((8, 40_000), np.float32)  # 1.25 MiB, over the 1 MiB the server takes
        with pytest.raises(InferenceServerException) as info:
            c.infer("identity", [infer_input("INPUT0", big)])
        assert status_of(info.value) == "RESOURCE_EXHAUSTED"
        good(c)
    finally:
        c.close()


def test_not_ready_server_and_the_ready_filter(small: ModelsvcProcess) -> None:
    c = grpcclient.InferenceServerClient(target(small))
    try:
        assert c.is_server_live()
        assert not c.is_server_ready()  # a model that should load did not: false, not an error
        assert not c.is_model_ready("broken")
        every = {m.name: m for m in c.get_model_repository_index().models}
        assert every["identity"].state == "READY"
        assert every["broken"].state == "UNAVAILABLE"
        assert "config.pbtxt" in every["broken"].reason
        ready = [m.name for m in c.get_model_repository_index().models if m.state == "READY"]
        filtered = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(small))).RepositoryIndex(
            service_pb2.RepositoryIndexRequest(ready=True), timeout=WAIT
        )
        assert [m.name for m in filtered.models] == ready == ["identity"]
        with pytest.raises(InferenceServerException) as info:
            c.infer("broken", [infer_input("INPUT0", ROW)])
        assert status_of(info.value) == "UNAVAILABLE"
    finally:
        c.close()


def test_grpc_can_be_switched_off(tmp_path: Path) -> None:
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    with ModelsvcProcess(tmp_path, "--allow-grpc", "false") as proc:
        c = grpcclient.InferenceServerClient(target(proc))
        try:
            with pytest.raises(InferenceServerException) as info:
                c.is_server_live(client_timeout=2.0)
            assert status_of(info.value) in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        finally:
            c.close()
        assert "gRPC v2 endpoint" not in proc.log()


def test_a_grpc_port_in_use_stops_the_start(tmp_path: Path) -> None:
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = ModelsvcProcess(tmp_path, "--grpc-address", "127.0.0.1")
        proc.grpc_port = taken.getsockname()[1]
        assert proc.start().wait_exit() == 1
    assert f"cannot listen on 127.0.0.1:{proc.grpc_port} for gRPC" in proc.log()


def test_message_size_flag() -> None:
    args = _parser().parse_args(["serve", "--model-repository", ".", "--grpc-max-message-size", "1024"])
    assert args.grpc_max_message_size == 1024
    assert _parser().parse_args(["serve", "--model-repository", "."]).grpc_max_message_size == 64 * 1024 * 1024
    for bad in ("0", "2147483648", "lots"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["serve", "--model-repository", ".", "--grpc-max-message-size", bad])


async def test_sigterm_drains_in_flight_calls_and_open_streams(tmp_path: Path) -> None:
    om.write_model(
        tmp_path,
        "held",
        om.identity(),
        identity_config("held", extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }"),
    )
    proc = ModelsvcProcess(tmp_path, "--grpc-address", "127.0.0.1")
    with proc:
        async with grpc.aio.insecure_channel(target(proc)) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            unary = asyncio.ensure_future(stub.ModelInfer(raw_request("held", ONE, [FP32_ROW], id="u"), timeout=WAIT))
            sent: asyncio.Queue[Any] = asyncio.Queue()
            await sent.put(raw_request("held", ONE, [FP32_ROW], id="s"))

            async def stream_requests():
                while (item := await sent.get()) is not None:  # the client keeps its side open
                    yield item

            stream = stub.ModelStreamInfer(stream_requests(), timeout=WAIT)
            await until(lambda: metric(proc, "nv_inference_pending_request_count", "held") == 2, "two queued")
            t0 = time.monotonic()
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            answer = await unary
            streamed = [await stream.read()]
            with pytest.raises(grpc.aio.AioRpcError):
                await stream.read()
            code, details = await stream.code(), await stream.details()
            await sent.put(None)
        assert answer.id == "u"
        assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), ROW.reshape(-1))
        assert [a.infer_response.id for a in streamed] == ["s"]
        assert not streamed[0].error_message
        assert code is grpc.StatusCode.UNAVAILABLE  # the stream ends: the client had not closed its side
        assert "shutting down" in details
        assert proc.wait_exit() == 0
        assert time.monotonic() - t0 < 15  # well before the 30 s grace period or the 60 s delay
    assert "draining" in proc.log()


def test_the_grpcio_engine_still_serves_from_the_command_line(tmp_path: Path) -> None:
    """``--grpc-engine grpcio``: grpcio's own server, the fallback to the default HTTP/2-in-the-loop engine."""
    assert _parser().parse_args(["serve", "--model-repository", "."]).grpc_engine == "h2"
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--model-repository", ".", "--grpc-engine", "nghttp2"])
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    with ModelsvcProcess(tmp_path, "--grpc-address", "127.0.0.1", "--grpc-engine", "grpcio") as proc:
        c = grpcclient.InferenceServerClient(target(proc))
        try:
            good(c)
            with pytest.raises(InferenceServerException) as info:
                c.infer("nothing", [infer_input("INPUT0", ROW)])
            assert status_of(info.value) in ("NOT_FOUND", "UNAVAILABLE")
        finally:
            c.close()
        assert "(engine grpcio)" in proc.log()
