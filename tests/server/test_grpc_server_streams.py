"""The v2 gRPC endpoint's streams (tritonclient's, the aio client's and grpcio's: every request answered in
order, errors with their request id, a cancelled stream's queued requests withdrawn), and tritonclient.grpc.aio
and modelsvc.client over gRPC, against the session's shared server. What they share: tests/_grpc.py.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelsvc.client import AsyncClient, Client, InvalidInput, ModelNotFound
from tests import _grpc
from tests._grpc import (
    FP32_ROW,
    NO_LOAD,
    ONE,
    ROW,
    WAIT,
    executions,
    good,
    infer_input,
    metric,
    raw_request,
    status_of,
    target,
    until,
)
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

# tritonclient's client on the session's server
client = _grpc.client


# -- streams ------------------------------------------------------------------------------------------------


def test_stream_answers_every_request_in_order_and_survives_a_failure(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        # the first fails only after 200 ms (queue timeout): later answers must still wait for it
        client.async_stream_infer("timed", [infer_input("INPUT0", ROW)], request_id="s0")
        for i in range(1, 6):
            data = np.zeros((1, 3), np.float32) if i == 3 else ROW * i  # a bad shape in the middle
            client.async_stream_infer("identity", [infer_input("INPUT0", data)], request_id=f"s{i}")
    finally:
        client.stop_stream()
    got = [answers.get(timeout=WAIT) for _ in range(6)]
    assert answers.empty()
    assert got[0][0] is None
    assert "timeout expired" in got[0][1].message()
    assert got[3][0] is None
    assert "INPUT0" in got[3][1].message()
    for i in (1, 2, 4, 5):
        result, error = got[i]
        assert error is None
        assert result.get_response().id == f"s{i}"
        assert np.array_equal(result.as_numpy("OUTPUT0"), ROW * i)
    good(client)


async def test_aio_stream_reports_errors_with_the_request_id(server: ModelsvcProcess) -> None:
    def inputs(array: np.ndarray) -> list[aioclient.InferInput]:
        inp = aioclient.InferInput("INPUT0", list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        return [inp]

    async def requests():
        yield {"model_name": "identity", "inputs": inputs(ROW), "request_id": "a"}
        yield {"model_name": "nope", "inputs": inputs(ROW), "request_id": "b"}
        yield {"model_name": "identity", "inputs": inputs(ROW + 1), "request_id": "c"}

    async with aioclient.InferenceServerClient(target(server)) as c:
        got = [(result, error) async for result, error in c.stream_infer(requests())]
    assert [r.get_response().id if r is not None else None for r, _ in got] == ["a", None, "c"]
    assert "nope" in got[1][1].message()
    assert np.array_equal(got[2][0].as_numpy("OUTPUT0"), ROW + 1)

    # with grpcio's stub: the failed answer carries the id and model of its request and no outputs
    async with grpc.aio.insecure_channel(target(server)) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([raw_request("nope", ONE, [FP32_ROW], id="x1"), raw_request("identity", ONE, [FP32_ROW], id="x2")])
        )
        raw = [answer async for answer in call]
        assert await call.code() is grpc.StatusCode.OK
    assert raw[0].error_message
    assert (raw[0].infer_response.id, raw[0].infer_response.model_name) == ("x1", "nope")
    assert not raw[0].infer_response.outputs
    assert not raw[1].error_message
    assert raw[1].infer_response.id == "x2"
    for answer in raw:  # each request's one answer is its last, as Triton marks it
        assert answer.infer_response.parameters["triton_final_response"].bool_param


async def test_cancelled_stream_withdraws_its_queued_requests(server: ModelsvcProcess) -> None:
    """'held' waits 60 s for a batch: a stream whose client goes away leaves nothing of itself in the queue."""
    before = executions(server, "held")
    async with grpc.aio.insecure_channel(target(server)) as channel:
        release = asyncio.Event()

        async def requests():
            yield raw_request("held", ONE, [FP32_ROW], id="h1")
            yield raw_request("held", ONE, [FP32_ROW], id="h2")
            await release.wait()

        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        await until(lambda: metric(server, "nv_inference_pending_request_count", "held") == 2, "two queued")
        call.cancel()
        release.set()
        await until(lambda: metric(server, "nv_inference_pending_request_count", "held") == 0, "the withdrawal")
    assert executions(server, "held") == before


# -- tritonclient.grpc.aio and modelsvc.client ---------------------------------------------------------------


async def test_aio_client_every_rpc(server: ModelsvcProcess) -> None:
    async with aioclient.InferenceServerClient(target(server)) as c:
        assert await c.is_server_live()
        assert await c.is_server_ready()
        assert not await c.is_model_ready("nope")
        assert (await c.get_server_metadata()).name == "modelsvc"
        assert (await c.get_model_metadata("identity")).inputs[0].datatype == "FP32"
        assert (await c.get_model_config("identity")).config.max_batch_size == 8
        inp = aioclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(ROW)
        results = await asyncio.gather(*(c.infer("identity", [inp], request_id=str(i)) for i in range(16)))
        assert sorted(int(r.get_response().id) for r in results) == list(range(16))
        assert all(np.array_equal(r.as_numpy("OUTPUT0"), ROW) for r in results)
        stats = await c.get_inference_statistics("identity")
        assert stats.model_stats[0].inference_stats.success.count >= 16
        index = await c.get_model_repository_index()
        assert {m.name for m in index.models} >= {"identity", "add_sub"}
        for call in (c.load_model("identity"), c.unload_model("identity", unload_dependents=True)):
            with pytest.raises(InferenceServerException) as info:
                await call
            assert status_of(info.value) == "UNAVAILABLE"
            assert NO_LOAD in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            await c.infer("nope", [inp])
        assert status_of(info.value) == "NOT_FOUND"
        assert (await c.infer("identity", [inp])).as_numpy("OUTPUT0") is not None


async def test_modelsvc_client_over_grpc(server: ModelsvcProcess) -> None:
    url = f"grpc://{target(server)}"
    with Client(url) as client:
        assert client.server_live()
        assert client.server_ready()
        assert client.model_config("identity")["max_batch_size"] == 8
        model = client.model("add_sub")
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        out = model.infer(INPUT0=a, INPUT1=np.ones_like(a))
        assert np.array_equal(out["OUTPUT0"], a + 1)
        words = client.model("identity_bytes").infer(INPUT0=[["a", b"b\x00", "naïve", ""]])["OUTPUT0"]
        assert words.tolist() == [[b"a", b"b\x00", "naïve".encode(), b""]]
        with pytest.raises(ModelNotFound):
            client.model_metadata("nope")
        with pytest.raises(InvalidInput):
            client.infer("identity", {"INPUT0": np.ones((1, 3), np.float32)})
    async with AsyncClient(url) as aclient:
        result = await aclient.infer("identity", {"INPUT0": ROW}, request_id="mc")
        assert result.id == "mc"
        assert np.array_equal(result["OUTPUT0"], ROW)
