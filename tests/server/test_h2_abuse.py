"""The gRPC door's HTTP/2 engine (``grpc/h2/``) against abusive peers (issue 29): each attack of
``loadtests/abuse/_attacks.py`` on a real ``modelsvc serve``, the bound it must meet, and a well-behaved
tritonclient.grpc client served while the attack's connections are still open. The ``h2`` package plays the
strict peer where the attacker keeps to the protocol; raw frames where it does not."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from loadtests.abuse import _attacks as at
from modelsvc.server.grpc.h2._limits import H2Limits
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

ROW = np.arange(16, dtype=np.float32).reshape(1, 16)
MAX_STREAMS = 50


def _repo(path: Path) -> Path:
    om.write_model(path, "identity", om.identity(), identity_config("identity"))
    om.write_model(path, "wide", om.identity(dims=["batch", -1]), identity_config("wide", dims="-1"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = _repo(tmp_path_factory.mktemp("abuse"))
    limits = ("--grpc-max-concurrent-streams", str(MAX_STREAMS), "--grpc-max-message-size", str(64 << 20))
    with ModelsvcProcess(repo, "--grpc-address", "127.0.0.1", *limits) as proc:
        yield proc


def served(proc: ModelsvcProcess) -> bool:
    """One ModelInfer from a well-behaved client on a connection of its own."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}")
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(ROW)
        return bool(np.array_equal(client.infer("identity", [inp], client_timeout=10).as_numpy("OUTPUT0"), ROW))
    finally:
        client.close()


def rss_mb(proc: ModelsvcProcess) -> float:
    assert proc.proc is not None
    return at.rss_bytes(proc.proc.pid) / 1e6


def test_a_header_block_without_end_is_cut_off_at_the_metadata_limit(server: ModelsvcProcess) -> None:
    before = rss_mb(server)
    out = at.continuation_flood(server.grpc_port, limit=8 << 20)
    assert out.ended == "GOAWAY ENHANCE_YOUR_CALM"
    assert out.accepted <= 256 << 10  # 64 KiB taken, the rest sent before the client saw the close
    assert rss_mb(server) - before < 5
    assert served(server)


def test_rapid_reset_gets_goaway_enhance_your_calm(server: ModelsvcProcess) -> None:
    out = at.rapid_reset(server.grpc_port, streams=5000)
    assert out.ended == "GOAWAY ENHANCE_YOUR_CALM"
    assert 1000 < out.accepted < 5000
    assert served(server)


def test_streams_beyond_the_advertised_limit_are_refused(server: ModelsvcProcess) -> None:
    client = at.H2Client(server.grpc_port)
    try:
        assert client.conn.remote_settings.max_concurrent_streams == MAX_STREAMS
        block = hpack.Encoder().encode(at.request_headers(server.grpc_port))
        # raw HEADERS (no message yet, so every call stays open): the h2 package would keep to the limit
        client.sock.sendall(b"".join(at.frame(at.HEADERS, at.END_HEADERS, 2 * i + 1, block) for i in range(60)))
        codes: list[int] = []
        reader = at._Reader(client.sock)
        reader.poll(2.0)
        data, pos = bytes(reader.data), 0
        while pos + 9 <= len(data):
            length = int.from_bytes(data[pos : pos + 3], "big")
            if data[pos + 3] == at.RST_STREAM:
                codes.append(struct.unpack(">I", data[pos + 9 : pos + 13])[0])
            pos += 9 + length
        assert codes == [at.REFUSED_STREAM] * (60 - MAX_STREAMS)
        assert served(server)
    finally:
        client.close()


def test_stalled_streams_hold_a_window_and_one_message_at_most(server: ModelsvcProcess) -> None:
    """Streams that each send 512 KiB of a declared 4 MiB message and stall: each may send its initial window,
    and only one of them gets the window its message needs (the connection's reservations are spent)."""
    before = rss_mb(server)
    stall = at.Stall(server.grpc_port, 200)
    try:
        out = stall.run()
        assert out.ended == "still open"
        assert out.streams == MAX_STREAMS  # the client kept to the advertised limit
        limits = H2Limits()
        assert out.accepted <= MAX_STREAMS * limits.stream_window + limits.connection_window
        assert rss_mb(server) - before < 20
        assert served(server)
    finally:
        stall.close()


def test_a_peer_that_does_not_read_stops_being_read(server: ModelsvcProcess) -> None:
    """PINGs and calls from a client that reads none of the answers: the server stops reading it once what it
    could not send passes its write bound, and the client's sends block (TCP backpressure)."""
    before = rss_mb(server)
    flood = at.PingFlood(server.grpc_port, limit=3_000_000, stall_s=1.0, with_calls=True, rcvbuf=4096)
    try:
        out = flood.run()
        assert out.ended == "not read (TCP backpressure)"
        assert rss_mb(server) - before < 30
        assert served(server)
    finally:
        flood.close()


def test_pings_alone_get_goaway_enhance_your_calm(server: ModelsvcProcess) -> None:
    flood = at.PingFlood(server.grpc_port, limit=2_000_000)
    try:
        assert flood.run().ended == "GOAWAY ENHANCE_YOUR_CALM"
        assert served(server)
    finally:
        flood.close()


async def test_large_messages_on_one_connection_still_arrive(server: ModelsvcProcess) -> None:
    """Three 12 MiB messages at once on one connection, each far over the windows: each gets through in turn."""
    rng = np.random.default_rng(1)
    arrays = [rng.random((1, 3 << 20), dtype=np.float32) for _ in range(3)]
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        requests = []
        for i, array in enumerate(arrays):
            request = service_pb2.ModelInferRequest(model_name="wide", id=str(i))
            request.inputs.add(name="INPUT0", datatype="FP32", shape=list(array.shape))
            request.raw_input_contents.append(array.tobytes())
            requests.append(request)
        answers = await asyncio.gather(*(stub.ModelInfer(r, timeout=60) for r in requests))
    for array, answer in zip(arrays, answers, strict=True):
        assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), array.reshape(-1))


def test_the_budget_refuses_new_calls_and_past_it_closes_a_holder(tmp_path: Path) -> None:
    """A process budget of 192 KiB (the least it may be: one largest message, 128 KiB, and a window of 64 KiB):
    three connections that each stall a window's worth of a message take it all, and a new call is refused
    (RESOURCE_EXHAUSTED); one of them sends more of its message (the server let the first messages past their
    spent windows while there was room), the budget is passed, and that connection, holding the most, is closed
    (GOAWAY ENHANCE_YOUR_CALM); the others stay, and a new call is served."""
    flags = (
        "--grpc-address", "127.0.0.1", "--grpc-max-message-size", str(128 << 10),
        "--grpc-stream-window", str(64 << 10), "--grpc-connection-window", str(64 << 10),
        "--grpc-buffer-budget", str(64 << 10),
    )  # fmt: skip
    with ModelsvcProcess(_repo(tmp_path), *flags) as proc:
        stalls: list[at.Stall] = []
        try:
            for _ in range(3):
                stalls.append(at.Stall(proc.grpc_port, 1, send=64 << 10, declared=120 << 10))
                assert stalls[-1].run().accepted == 64 << 10
            with pytest.raises(InferenceServerException, match="too many request bytes") as info:
                served(proc)
            assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            first = stalls[0].client
            more = first.conn.local_flow_control_window(1)
            assert more > 0  # what the server let past the spent window
            first.conn.send_data(1, bytes(more))
            first.flush()
            for stall in stalls:
                stall.client.pump(0.5)
            assert [stall.client.ended for stall in stalls] == ["GOAWAY ENHANCE_YOUR_CALM", None, None]
            assert served(proc)
        finally:
            for stall in stalls:
                stall.close()


def test_a_bad_limit_flag_is_refused(tmp_path: Path) -> None:
    proc = ModelsvcProcess(tmp_path, "--grpc-connection-window", "100")
    proc.start()
    assert proc.wait_exit(30) == 2
    assert "connection_window must be between 1024" in proc.log()
