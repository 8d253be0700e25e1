"""The v2 gRPC endpoint, driven by tritonclient.grpc and grpcio's own stub against the session's shared server:
health, metadata, config, statistics and the repository; inference, every datatype, bad requests and the queue's
limits. Tracing and what a client never sees are checked in-process.

Streams and the aio clients: tests/server/test_grpc_server_streams.py; servers of their own (their own flags, SIGTERM,
the grpcio engine): tests/server/test_grpc_server_processes.py; what they share: tests/_grpc.py.
"""

from __future__ import annotations

import asyncio
import struct
import time
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
from tritonclient.utils import InferenceServerException

from modelsvc.protocol import InvalidArgument, serialize_bytes_tensor
from modelsvc.protocol._pbjson import message_to_json
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, ModelManager
from modelsvc.server.grpc._service import GrpcServer, decode_infer_request, grpc_status
from modelsvc.server.observe._tracing import TraceSettings, start_tracing
from modelsvc.tools import onnx_models as om
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
from tests.conftest import DTYPES, identity_config

pytestmark = pytest.mark.integration

# tritonclient's client and grpcio's stub on the session's server
client = _grpc.client
stub = _grpc.stub


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
