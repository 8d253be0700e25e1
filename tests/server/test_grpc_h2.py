"""The gRPC endpoint's own HTTP/2 (``grpc/h2/``, ``grpc/_calls``) against real clients: what grpcio's server used to
do for modelsvc (method routing, deadlines, compression, flow control for large messages, many calls on one
connection) and the HTTP/2 rules a raw client can break. One server for the module."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelsvc.server.grpc.h2._connection import GOAWAY, PING, PREFACE, SETTINGS, frame
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

WAIT = 20.0
ROW = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("h2repo")
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "wide", om.identity(dims=["batch", -1]), identity_config("wide", dims="-1"))
    held = identity_config("held", extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }")
    om.write_model(repo, "held", om.identity(), held)
    with ModelsvcProcess(repo, "--grpc-address", "127.0.0.1") as proc:
        yield proc


def target(proc: ModelsvcProcess) -> str:
    return f"127.0.0.1:{proc.grpc_port}"


def infer_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), "FP32")
    inp.set_data_from_numpy(array)
    return inp


def raw_request(model: str, array: np.ndarray, request_id: str = "") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request


def pending(proc: ModelsvcProcess, model: str) -> float:
    text = httpx.get(proc.metrics_url).text
    prefix = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    return float(next(ln for ln in text.splitlines() if ln.startswith(prefix))[len(prefix) :])


def test_unknown_and_unoffered_methods_are_unimplemented(server: ModelsvcProcess) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        nope = channel.unary_unary("/inference.GRPCInferenceService/Nope")
        with pytest.raises(grpc.RpcError) as info:
            nope(b"", timeout=WAIT)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert info.value.details() == "Method not found!"
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest(), timeout=WAIT)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as info:  # bytes that are no ModelInferRequest
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(b"\xff\xff\xff", timeout=WAIT)
        assert info.value.code() is grpc.StatusCode.INTERNAL
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=WAIT).live  # the connection goes on


def test_a_deadline_withdraws_the_queued_request(server: ModelsvcProcess) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:  # 'held' waits 60 s for a batch
            stub.ModelInfer(raw_request("held", ROW), timeout=0.5)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + WAIT
    while pending(server, "held") != 0:
        assert time.monotonic() < deadline, "the request stayed queued after its deadline"
        time.sleep(0.05)


async def test_4_mib_tensors_both_ways_several_at_once(server: ModelsvcProcess) -> None:
    """Messages far over the default 64 KiB windows and 16 KiB frames: flow control in both directions."""
    rng = np.random.default_rng(0)
    arrays = [rng.random((1, 1 << 20), dtype=np.float32) for _ in range(3)]
    async with grpc.aio.insecure_channel(
        target(server), options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = await asyncio.gather(
            *(stub.ModelInfer(raw_request("wide", a, str(i)), timeout=WAIT) for i, a in enumerate(arrays))
        )
    for i, (array, answer) in enumerate(zip(arrays, answers, strict=True)):
        assert answer.id == str(i)
        assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), array.reshape(-1))


async def test_many_calls_on_one_connection_each_get_their_own_answer(server: ModelsvcProcess) -> None:
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        rows = [np.full((1, 16), i, np.float32) for i in range(200)]
        answers = await asyncio.gather(
            *(
                stub.ModelInfer(raw_request("identity", r, f"r{i}"), metadata=[("x-trace-bin", b"\x00\xff")])
                for i, r in enumerate(rows)
            )
        )
    for i, answer in enumerate(answers):
        assert answer.id == f"r{i}"
        assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), rows[i].reshape(-1))


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_inflated(server: ModelsvcProcess, algorithm: str) -> None:
    client = grpcclient.InferenceServerClient(target(server))
    try:
        result = client.infer("identity", [infer_input("INPUT0", ROW)], compression_algorithm=algorithm)
        assert np.array_equal(result.as_numpy("OUTPUT0"), ROW)
    finally:
        client.close()


def test_an_error_message_outside_ascii_reaches_the_client_intact(server: ModelsvcProcess) -> None:
    client = grpcclient.InferenceServerClient(target(server))
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity", [infer_input("ÏNPUT0 ✓ 100%", ROW)])
        assert "ÏNPUT0 ✓ 100%" in info.value.message()
        assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()


def _frames(sock: socket.socket, until_type: int) -> list[tuple[int, int, bytes]]:
    """Frames read from ``sock`` up to and including the first of ``until_type``."""
    got: list[tuple[int, int, bytes]] = []
    data = b""
    sock.settimeout(WAIT)
    while True:
        while len(data) >= 9 and len(data) >= 9 + (length := int.from_bytes(data[:3], "big")):
            ftype, flags = data[3], data[4]
            got.append((ftype, flags, data[9 : 9 + length]))
            data = data[9 + length :]
            if ftype == until_type:
                return got
        chunk = sock.recv(65536)
        if not chunk:
            return got
        data += chunk


def test_ping_is_answered_and_a_bad_preface_is_refused(server: ModelsvcProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"12345678"))
        got = _frames(sock, PING)
        assert (PING, 1, b"12345678") in got  # ACK, same payload
        assert any(t == SETTINGS and f == 0 for t, f, _ in got)  # the server's own settings
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = _frames(sock, GOAWAY)
        goaway = next(payload for t, _, payload in got if t == GOAWAY)
        assert struct.unpack(">I", goaway[4:8])[0] == 1  # PROTOCOL_ERROR
        sock.settimeout(WAIT)
        assert sock.recv(1) == b""  # and the connection closes


def test_the_server_still_answers(server: ModelsvcProcess) -> None:
    client = grpcclient.InferenceServerClient(target(server))
    try:
        assert np.array_equal(client.infer("identity", [infer_input("INPUT0", ROW)]).as_numpy("OUTPUT0"), ROW)
    finally:
        client.close()


@pytest.mark.parametrize("engine", ["h2", "grpcio"])
async def test_both_engines_answer_alike(tmp_path: Path, engine: str) -> None:
    """``GrpcServer(engine=...)``: the HTTP/2 of this package (the default) and grpcio's server, same service."""
    from modelsvc.repository import ModelRepository
    from modelsvc.server import DataPlane, ModelManager
    from modelsvc.server.grpc._service import GrpcServer

    om.write_model(tmp_path, "solo", om.identity(), identity_config("solo"))
    models = ModelManager(ModelRepository(tmp_path))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    server = GrpcServer(dataplane, engine=engine, max_message_size=4096)
    await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.address[1]}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = await stub.ModelInfer(raw_request("solo", ROW, "a"))
            assert answer.id == "a"
            assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), ROW.reshape(-1))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(raw_request("nope", ROW))
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as info:  # 8 KiB of input over a 4 KiB limit
                await stub.ModelInfer(raw_request("solo", np.zeros((8, 256), np.float32)))
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.shutdown(1)
        await models.close()
    with pytest.raises(ValueError, match="unknown gRPC engine"):
        GrpcServer(dataplane, engine="other")


def test_split_raw_inputs_takes_views_and_keeps_every_other_field() -> None:
    from modelsvc.server.grpc._wire import split_raw_inputs

    request = raw_request("m", np.ones((1, 3), np.float32), "x")
    request.inputs.add(name="B", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(b"\x00" * 8)
    request.parameters["priority"].int64_param = 5
    encoded = request.SerializeToString()
    rest, raws = split_raw_inputs(encoded)
    assert [bytes(r) for r in raws] == list(request.raw_input_contents)
    assert all(isinstance(r, memoryview) and r.obj is encoded for r in raws)  # views, not copies
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    assert (parsed.model_name, parsed.id, len(parsed.inputs), parsed.parameters["priority"].int64_param) == (
        "m",
        "x",
        2,
        5,
    )
    assert not parsed.raw_input_contents
    for broken in (encoded[:-3], b"\x3a\xff\xff\xff\xff\x0f", b"\x0f"):
        with pytest.raises(ValueError, match=r"past the end|wire type|ends inside"):
            split_raw_inputs(broken)
