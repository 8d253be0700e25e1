"""The v2 gRPC endpoint, driven by tritonclient.grpc (sync and aio) and grpcio's own stub against real servers.

Most tests use the session's shared server; the ones that need their own flags (a small message limit, a model
that does not load) or stop the server (SIGTERM) start their own. Tracing is checked in-process.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from modelsvc._cli import _parser
from modelsvc.client import AsyncClient, Client, InvalidInput, ModelNotFound
from modelsvc.protocol import InvalidArgument, serialize_bytes_tensor
from modelsvc.protocol._pbjson import message_to_json
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, ModelManager
from modelsvc.server.grpc._service import GrpcServer, decode_infer_request, grpc_status
from modelsvc.server.observe._tracing import TraceSettings, start_tracing
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import DTYPES, identity_config

pytestmark = pytest.mark.integration

WAIT = 20.0
NO_LOAD = "explicit model load / unload is not allowed if polling is enabled"


def target(proc: ModelsvcProcess) -> str:
    return f"127.0.0.1:{proc.grpc_port}"


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(target(server))
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server: ModelsvcProcess) -> Iterator[Any]:
    """grpcio's own stub, for requests tritonclient never builds (typed contents, malformed ones)."""
    with grpc.insecure_channel(target(server)) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer_input(name: str, array: np.ndarray, datatype: str | None = None) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype or np_to_triton_dtype(array.dtype))
    inp.set_data_from_numpy(array)
    return inp


ROW = np.arange(16, dtype=np.float32).reshape(1, 16)


def good(client: grpcclient.InferenceServerClient) -> None:
    """The server still answers a valid request."""
    assert np.array_equal(client.infer("identity", [infer_input("INPUT0", ROW)]).as_numpy("OUTPUT0"), ROW)


def status_of(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def metric(proc: ModelsvcProcess, name: str, model: str) -> float:
    text = httpx.get(proc.metrics_url).text
    prefix = f'{name}{{model="{model}",version="1"}} '
    return float(next(ln for ln in text.splitlines() if ln.startswith(prefix))[len(prefix) :])


async def until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- health, metadata, config, statistics, repository ----------------------------------------------------------


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "modelsvc"
    assert "binary_tensor_data" in meta.extensions
    assert "statistics" in meta.extensions


def test_model_ready_is_false_not_an_error(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", "1")
    assert not client.is_model_ready("identity", "7")
    assert not client.is_model_ready("nope")


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["name"] == "add_sub"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]},  # int64 as strings: MessageToDict
        {"name": "INPUT1", "datatype": "FP32", "shape": ["-1", "16"]},
    ]
    assert client.get_model_metadata("versioned").versions == ["2", "3"]
    assert list(client.get_model_metadata("nobatch").inputs[0].shape) == [16]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert status_of(info.value) == "NOT_FOUND"
    assert "nope" in info.value.message()


def test_model_config_is_the_proto_http_serves(client: grpcclient.InferenceServerClient, server) -> None:
    for model in ("identity", "add_sub", "auto_add_sub", "token", "timed", "versioned"):
        config = client.get_model_config(model).config
        assert config.name == model
        assert message_to_json(config) == httpx.get(f"{server.base}/v2/models/{model}/config").json()
    assert client.get_model_config("identity").config.dynamic_batching is not None
    timed = client.get_model_config("timed").config.dynamic_batching.default_queue_policy
    assert (timed.default_timeout_microseconds, timed.max_queue_size) == (200000, 2)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("nope")
    assert status_of(info.value) == "NOT_FOUND"


def test_statistics_count_inferences_as_http_does(client: grpcclient.InferenceServerClient, server) -> None:
    before = client.get_inference_statistics("identity_fp64").model_stats[0]
    data = np.ones((2, 4), np.float64)
    for _ in range(3):
        client.infer("identity_fp64", [infer_input("INPUT0", data)])
    with pytest.raises(InferenceServerException):
        client.infer("identity_fp64", [infer_input("INPUT0", np.ones((2, 5), np.float64))])
    stats = client.get_inference_statistics("identity_fp64").model_stats[0]
    assert (stats.name, stats.version) == ("identity_fp64", "1")
    assert stats.inference_count - before.inference_count == 6  # 3 requests of 2 rows
    assert stats.inference_stats.success.count - before.inference_stats.success.count == 3
    assert stats.inference_stats.fail.count - before.inference_stats.fail.count == 1
    assert stats.inference_stats.compute_infer.ns > 0
    assert any(b.batch_size == 2 for b in stats.batch_stats)
    assert stats.last_inference > 0
    http = httpx.get(f"{server.base}/v2/models/identity_fp64/stats").json()["model_stats"][0]
    assert http["inference_count"] == stats.inference_count
    assert http["inference_stats"]["success"] == {
        "count": stats.inference_stats.success.count,
        "ns": stats.inference_stats.success.ns,
    }
    names = {m.name for m in client.get_inference_statistics().model_stats}
    assert {"identity", "add_sub", "token"} <= names
    assert client.get_inference_statistics("versioned", "2").model_stats[0].version == "2"
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("nope")
    assert status_of(info.value) == "NOT_FOUND"


def test_repository_index(client: grpcclient.InferenceServerClient) -> None:
    rows = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert rows[("identity", "1")] == "READY"
    assert rows[("versioned", "3")] == "READY"
    assert ("versioned", "1") not in rows


def test_load_and_unload_answer_as_triton_does_without_model_control(
    client: grpcclient.InferenceServerClient,
) -> None:
    for call in (lambda: client.load_model("identity"), lambda: client.unload_model("identity")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert status_of(info.value) == "UNAVAILABLE"
        assert NO_LOAD in info.value.message()
    with pytest.raises(InferenceServerException, match="not allowed"):
        client.load_model("identity", config='{"max_batch_size": 4}', files={"file:1/model.onnx": b"x"})
    assert client.is_model_ready("identity")


# -- inference ----------------------------------------------------------------------------------------------


def test_add_sub_with_id_outputs_and_version(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    result = client.infer("add_sub", [infer_input("INPUT0", a), infer_input("INPUT1", b)], request_id="req-7")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-7", "add_sub", "1")
    subset = client.infer(
        "add_sub",
        [infer_input("INPUT0", a), infer_input("INPUT1", b)],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    assert subset.as_numpy("OUTPUT0") is None
    assert np.array_equal(subset.as_numpy("OUTPUT1"), a - b)
    assert client.infer("versioned", [infer_input("INPUT0", ROW)]).get_response().model_version == "3"
    second = client.infer("versioned", [infer_input("INPUT0", ROW)], model_version="2")
    assert second.get_response().model_version == "2"


def test_priority_and_timeout_parameters_are_taken(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("identity", [infer_input("INPUT0", ROW)], priority=1, timeout=5_000_000)
    assert np.array_equal(result.as_numpy("OUTPUT0"), ROW)


def _sample(dtype: str) -> np.ndarray:
    if dtype == "BYTES":
        return np.array([[b"a", b"\x00bin", "naïve".encode(), b""]] * 2, dtype=np.object_)
    if dtype == "BOOL":
        return np.array([[True, False, True, True]] * 2)
    np_dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype) or np.dtype(dtype.lower())
    return (np.arange(8).reshape(2, 4) + 3).astype(np_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_datatype_round_trips_raw(client: grpcclient.InferenceServerClient, dtype: str) -> None:
    data = _sample(dtype)
    result = client.infer(f"identity_{dtype.lower()}", [infer_input("INPUT0", data, dtype)])
    got = result.as_numpy("OUTPUT0")
    if dtype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        assert got.dtype == data.dtype
        assert np.array_equal(got, data)


_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def typed_request(model: str, datatype: str, shape: list[int], field: str, values: list[Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id="typed")
    entry = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    getattr(entry.contents, field).extend(values)
    return request


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "FP16"])
def test_every_datatype_from_typed_contents(stub: Any, dtype: str) -> None:
    data = _sample(dtype)
    request = typed_request(f"identity_{dtype.lower()}", dtype, [2, 4], _TYPED_FIELD[dtype], data.reshape(-1).tolist())
    answer = stub.ModelInfer(request, timeout=WAIT)
    assert answer.id == "typed"
    (out,) = answer.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("OUTPUT0", dtype, [2, 4])
    assert len(answer.raw_output_contents) == 1  # answers always carry raw contents
    raw = answer.raw_output_contents[0]
    if dtype == "BYTES":
        assert raw == serialize_bytes_tensor(data)
    else:
        assert np.array_equal(np.frombuffer(raw, data.dtype).reshape(2, 4), data)


def test_fp16_and_bf16_travel_raw(client: grpcclient.InferenceServerClient, stub: Any) -> None:
    bf16 = np.array([[1.5, -2.0, 0.0078125, 2.0**100]], dtype=np.float32)  # all exact in bfloat16
    inp = grpcclient.InferInput("INPUT0", [1, 4], "BF16")
    inp.set_data_from_numpy(bf16)
    result = client.infer("identity_bf16", [inp])
    assert np.array_equal(result.as_numpy("OUTPUT0"), bf16)
    assert result.get_output("OUTPUT0").datatype == "BF16"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(typed_request("identity_fp16", "FP16", [1, 4], "fp32_contents", [1.0] * 4), timeout=WAIT)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in info.value.details()


def raw_request(model: str, inputs: list[tuple[str, str, list[int]]], raws: list[bytes], **fields: Any) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raws)
    return request


FP32_ROW = ROW.tobytes()
ONE = [("INPUT0", "FP32", [1, 16])]


def with_priority(value: str) -> Any:
    request = raw_request("identity", ONE, [FP32_ROW])
    request.parameters["priority"].string_param = value
    return request


def with_output(name: str) -> Any:
    request = raw_request("identity", ONE, [FP32_ROW])
    request.outputs.add(name=name)
    return request


BAD = {
    "unknown model": (raw_request("nope", ONE, [FP32_ROW]), "NOT_FOUND", ["nope"]),
    "unknown version": (raw_request("identity", ONE, [FP32_ROW], model_version="9"), "NOT_FOUND", ["identity", "9"]),
    "wrong shape": (
        raw_request("identity", [("INPUT0", "FP32", [1, 17])], [np.zeros(17, np.float32).tobytes()]),
        "INVALID_ARGUMENT",
        ["INPUT0", "[-1, 16]", "[1, 17]"],
    ),
    "wrong datatype": (
        raw_request("identity", [("INPUT0", "INT32", [1, 16])], [FP32_ROW]),
        "INVALID_ARGUMENT",
        ["INPUT0", "INT32", "FP32"],
    ),
    "unknown datatype": (
        raw_request("identity", [("INPUT0", "FP128", [1, 16])], [FP32_ROW]),
        "INVALID_ARGUMENT",
        ["FP128"],
    ),
    "raw size disagrees with shape": (
        raw_request("identity", ONE, [FP32_ROW[:60]]),
        "INVALID_ARGUMENT",
        ["INPUT0", "60 bytes", "64"],
    ),
    "more raw contents than inputs": (
        raw_request("identity", ONE, [FP32_ROW, FP32_ROW]),
        "INVALID_ARGUMENT",
        ["2 raw_input_contents", "1 inputs"],
    ),
    "negative dim": (
        raw_request("identity", [("INPUT0", "FP32", [-1, 16])], [FP32_ROW]),
        "INVALID_ARGUMENT",
        ["INPUT0", "negative"],
    ),
    "no data": (raw_request("identity", ONE, []), "INVALID_ARGUMENT", ["INPUT0", "16"]),
    "unknown input": (
        raw_request("identity", [("INPUTX", "FP32", [1, 16])], [FP32_ROW]),
        "INVALID_ARGUMENT",
        ["INPUTX", "INPUT0"],
    ),
    "missing input": (
        raw_request("add_sub", ONE, [FP32_ROW]),
        "INVALID_ARGUMENT",
        ["missing required input(s) ['INPUT1']"],
    ),
    "batch over max_batch_size": (
        raw_request("identity", [("INPUT0", "FP32", [9, 16])], [np.zeros((9, 16), np.float32).tobytes()]),
        "INVALID_ARGUMENT",
        ["batch-size", "8"],
    ),
    "truncated BYTES": (
        raw_request("identity_bytes", [("INPUT0", "BYTES", [1, 4])], [struct.pack("<I", 5) + b"abc"]),
        "INVALID_ARGUMENT",
        ["INPUT0", "BYTES"],
    ),
    "typed count disagrees with shape": (
        typed_request("identity", "FP32", [1, 16], "fp32_contents", [1.0, 2.0]),
        "INVALID_ARGUMENT",
        ["INPUT0", "2 elements", "16"],
    ),
    "typed contents in the wrong field": (
        typed_request("identity", "FP32", [1, 16], "int_contents", list(range(16))),
        "INVALID_ARGUMENT",
        ["INPUT0", "fp32_contents", "int_contents"],
    ),
    "typed value does not fit": (
        typed_request("identity_int8", "INT8", [1, 4], "int_contents", [1, 2, 3, 300]),
        "INVALID_ARGUMENT",
        ["INPUT0", "INT8"],
    ),
    "bad priority": (with_priority("high"), "INVALID_ARGUMENT", ["priority"]),
    "unknown output": (with_output("OUTPUT9"), "INVALID_ARGUMENT", ["OUTPUT9"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_request_gets_its_status_and_the_server_goes_on(
    stub: Any, client: grpcclient.InferenceServerClient, case: str
) -> None:
    request, code, fragments = BAD[case]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=WAIT)
    assert info.value.code().name == code
    for fragment in fragments:
        assert fragment in info.value.details()
    good(client)


def test_model_without_batching_takes_exact_dims(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.float32)
    assert np.array_equal(client.infer("nobatch", [infer_input("INPUT0", a)]).as_numpy("OUTPUT0"), a)
    with pytest.raises(InferenceServerException, match=r"Expected \[16\], got \[1, 16\]") as info:
        client.infer("nobatch", [infer_input("INPUT0", a.reshape(1, 16))])
    assert status_of(info.value) == "INVALID_ARGUMENT"


def test_queue_timeout_is_unavailable(client: grpcclient.InferenceServerClient) -> None:
    """'timed' waits 60 s for a batch, but its queue policy rejects after 200 ms (or a request's own timeout)."""
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.infer("timed", [infer_input("INPUT0", ROW)])
    assert 0.2 <= time.monotonic() - t0 < 5.0
    assert status_of(info.value) == "UNAVAILABLE"
    assert "timeout expired" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("timed", [infer_input("INPUT0", ROW)], timeout=50_000)
    assert status_of(info.value) == "UNAVAILABLE"
    good(client)


def executions(proc: ModelsvcProcess, model: str) -> int:
    return int(httpx.get(f"{proc.base}/v2/models/{model}/stats").json()["model_stats"][0]["execution_count"])


async def test_full_queue_is_unavailable_and_a_cancelled_call_leaves_the_queue(server: ModelsvcProcess) -> None:
    """'bounded' holds requests for 60 s with room for one: a second is refused; cancelling the first withdraws it."""
    before = executions(server, "bounded")
    async with aioclient.InferenceServerClient(target(server)) as c:
        inp = aioclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(ROW)
        first = asyncio.ensure_future(c.infer("bounded", [inp]))
        await until(lambda: metric(server, "nv_inference_pending_request_count", "bounded") == 1, "a queued request")
        with pytest.raises(InferenceServerException) as info:
            await c.infer("bounded", [inp])
        assert status_of(info.value) == "UNAVAILABLE"
        assert "maximum queue size of 1" in info.value.message()
        first.cancel()
        await until(lambda: metric(server, "nv_inference_pending_request_count", "bounded") == 0, "the withdrawal")
        assert (await c.is_server_live()) is True
    assert executions(server, "bounded") == before  # the cancelled request never ran


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


# -- in-process: tracing, and what a client never sees ------------------------------------------------------


async def test_traceparent_in_grpc_metadata_starts_the_request_trace(tmp_path: Path) -> None:
    om.write_model(tmp_path, "solo", om.identity(), identity_config("solo"))
    models = ModelManager(ModelRepository(tmp_path))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    exporter = InMemorySpanExporter()
    tracing = dataplane.tracing = start_tracing(TraceSettings(mode="opentelemetry", rate=0), exporter)
    assert tracing is not None
    server = GrpcServer(dataplane)
    await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.address[1]}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            parent = f"00-{0xABC:032x}-{0x42:016x}-01"
            ok = raw_request("solo", ONE, [FP32_ROW], id="t1")
            await stub.ModelInfer(ok, metadata=[("traceparent", parent)])
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.ModelInfer(raw_request("nope", ONE, [FP32_ROW]), metadata=[("traceparent", parent)])
            await stub.ModelInfer(ok)  # rate=0 and no context: not traced
    finally:
        await server.shutdown(1)
        tracing.provider.force_flush()
        tracing.shutdown()
        await models.close()
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(servers) == 2
    for span in servers:
        assert span.context.trace_id == 0xABC
        assert span.parent is not None
        assert span.parent.span_id == 0x42
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "grpc"
    done, failed = servers
    assert done.attributes is not None
    assert failed.attributes is not None
    assert (done.attributes["modelsvc.outcome"], done.attributes["rpc.grpc.status_code"]) == ("ok", 0)
    assert done.attributes["modelsvc.request.id"] == "t1"
    assert {s.name for s in exporter.get_finished_spans()} >= {"queue", "compute"}
    assert failed.attributes["modelsvc.outcome"] == "error"
    assert failed.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]


def test_unexpected_errors_show_nothing_of_themselves() -> None:
    code, message = grpc_status(RuntimeError("secret at /srv/models/x.py line 3"))
    assert code is grpc.StatusCode.INTERNAL
    assert "secret" not in message
    assert "x.py" not in message
    assert grpc_status(InvalidArgument("bad"))[0] is grpc.StatusCode.INVALID_ARGUMENT


def test_decoding_leaves_raw_bytes_uncopied() -> None:
    request = raw_request("m", ONE, [FP32_ROW], id="r")
    request.parameters["priority"].uint64_param = 2
    decoded = decode_infer_request(request)
    (tensor,) = decoded.inputs
    assert tensor.data.base is not None  # a view on the message's bytes
    assert not tensor.data.flags.writeable
    assert np.array_equal(tensor.data, ROW)
    assert (decoded.id, decoded.parameters, decoded.outputs) == ("r", {"priority": 2}, None)
    mixed = raw_request("m", ONE, [FP32_ROW])
    mixed.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    with pytest.raises(InvalidArgument, match="typed contents"):
        decode_infer_request(mixed)


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
