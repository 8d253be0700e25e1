"""The gRPC binding without Triton: requests and answers built and read without I/O, and an in-process grpcio
server for metadata, deadlines and status codes. (tests/interop/test_triton.py runs it against a real Triton.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelsvc.client import (
    AsyncClient,
    Client,
    ConnectError,
    ConnectionLost,
    InvalidInput,
    ProtocolError,
    RetryBudget,
    RetryPolicy,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from modelsvc.client._grpc import build_request, grpc_error, parse_response
from modelsvc.protocol import Tensor, serialize_bytes_tensor

FAST = RetryPolicy(attempts=3, backoff_s=0.001, max_backoff_s=0.005)


def _tensor(name: str, datatype: str, data: np.ndarray[Any, Any]) -> Tensor:
    return Tensor(name, datatype, tuple(data.shape), data)


# -- no I/O --------------------------------------------------------------------------------------------------


def test_request_carries_raw_contents_outputs_id_and_parameters() -> None:
    fp32 = np.arange(4, dtype=np.float32).reshape(1, 4)
    text = np.array([[b"ab", b""]], dtype=object)
    bf16 = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    request = build_request(
        "m",
        "2",
        [_tensor("A", "FP32", fp32), _tensor("B", "BYTES", text), _tensor("C", "BF16", bf16)],
        ["OUT"],
        "id-1",
        {"flag": True, "n": 3, "x": 0.5, "s": "v"},
    )
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "id-1")
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("A", "FP32", [1, 4]),
        ("B", "BYTES", [1, 2]),
        ("C", "BF16", [2]),
    ]
    assert request.raw_input_contents == [fp32.tobytes(), b"\x02\x00\x00\x00ab\x00\x00\x00\x00", bf16.tobytes()]
    assert len(request.raw_input_contents[2]) == 4  # 16 bits each
    assert [o.name for o in request.outputs] == ["OUT"]
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in request.parameters.items()}
    assert kinds == {"flag": "bool_param", "n": "int64_param", "x": "double_param", "s": "string_param"}


def test_request_refuses_parameters_grpc_cannot_carry() -> None:
    with pytest.raises(InvalidInput, match="parameter 'p'"):
        build_request("m", None, [], None, None, {"p": [1, 2]})


def _response(**fields: Any) -> Any:
    return service_pb2.ModelInferResponse(model_name="m", model_version="1", **fields)


def test_response_raw_and_typed_contents() -> None:
    raw = _response(id="r", outputs=[{"name": "A", "datatype": "INT16", "shape": [2, 2]}])
    raw.raw_output_contents.append(np.arange(4, dtype=np.int16).tobytes())
    result = parse_response(raw)
    assert result.id == "r"
    assert result["A"].dtype == np.int16
    np.testing.assert_array_equal(result["A"], [[0, 1], [2, 3]])

    typed = _response(
        outputs=[
            {"name": "F", "datatype": "FP32", "shape": [1, 2], "contents": {"fp32_contents": [1.5, 2.5]}},
            {"name": "S", "datatype": "BYTES", "shape": [2], "contents": {"bytes_contents": [b"x", b"yz"]}},
        ]
    )
    typed.parameters["sequence_end"].bool_param = True
    result = parse_response(typed)
    assert result.id is None
    assert result.parameters == {"sequence_end": True}
    assert result["F"].dtype == np.float32
    np.testing.assert_array_equal(result["F"], [[1.5, 2.5]])
    assert result["S"].tolist() == [b"x", b"yz"]
    assert result.datatypes == {"F": "FP32", "S": "BYTES"}


def test_response_bytes_raw() -> None:
    answer = _response(outputs=[{"name": "S", "datatype": "BYTES", "shape": [1, 2]}])
    answer.raw_output_contents.append(serialize_bytes_tensor(np.array([b"\xff", b"ok"], dtype=object)))
    assert parse_response(answer)["S"].tolist() == [[b"\xff", b"ok"]]


@pytest.mark.parametrize(
    ("outputs", "raw", "words"),
    [
        ([{"name": "A", "datatype": "FP32", "shape": [3]}], [b"\x00" * 8], "needs 12"),
        ([{"name": "A", "datatype": "FP32", "shape": [1]}], [b"\x00" * 4, b"\x00" * 4], "2 raw_output_contents"),
        ([{"name": "A", "datatype": "FP16", "shape": [1]}], [], "only as raw_output_contents"),
        ([{"name": "A", "datatype": "INT32", "shape": [2], "contents": {"int_contents": [1]}}], [], "needs 2"),
    ],
)
def test_malformed_responses_are_protocol_errors(outputs: list[Any], raw: list[bytes], words: str) -> None:
    answer = _response(outputs=outputs, raw_output_contents=raw)
    with pytest.raises(ProtocolError, match=words):
        parse_response(answer)


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused", ConnectError),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", ConnectionLost),
        (grpc.StatusCode.UNAVAILABLE, "Server is shutting down", ServerUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", Timeout),
        (grpc.StatusCode.INVALID_ARGUMENT, "bad shape", InvalidInput),
        (grpc.StatusCode.INTERNAL, "boom", ServerError),
    ],
)
def test_status_codes_map_into_the_tree(code: grpc.StatusCode, details: str, kind: type[Exception]) -> None:
    error = grpc_error(_FakeRpcError(code, details))
    assert type(error) is kind
    assert error.code == code.name


# -- an in-process grpcio server ------------------------------------------------------------------------------


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.unavailable_left = 0
        self.release = threading.Event()

    def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        if self.unavailable_left > 0:
            self.unavailable_left -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "Server is shutting down")
        return service_pb2.ServerMetadataResponse(name="fake", version="0", extensions=["a"])

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        self.release.wait(5.0)  # only the client's deadline ends this early
        return service_pb2.ModelMetadataResponse(name=request.name)

    def ModelInfer(self, request: Any, context: Any) -> Any:
        self.metadata.append(dict(context.invocation_metadata()))
        answer = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        for entry, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            answer.outputs.add(name=entry.name, datatype=entry.datatype, shape=entry.shape)
            answer.raw_output_contents.append(raw)
        return answer


@pytest.fixture
def fake() -> Iterator[tuple[str, _Servicer]]:
    servicer = _Servicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"grpc://127.0.0.1:{port}", servicer
    servicer.release.set()
    server.stop(grace=None)


def test_round_trip_headers_as_lowercase_metadata(fake: tuple[str, _Servicer]) -> None:
    url, servicer = fake
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    with Client(url, headers={"X-Team": "ml"}) as client:
        assert client.server_live()
        result = client.infer("m", {"INPUT0": rows, "TEXT": ["a", "bé"]}, request_id="q")
    np.testing.assert_array_equal(result["INPUT0"], rows)
    assert result["TEXT"].tolist() == [b"a", "bé".encode()]
    assert result.id == "q"
    assert servicer.metadata[0]["x-team"] == "ml"


def test_server_unavailable_is_retried(fake: tuple[str, _Servicer]) -> None:
    url, servicer = fake
    servicer.unavailable_left = 2
    with Client(url, retry=FAST, budget=RetryBudget(burst=100)) as client:
        assert client.server_metadata() == {"name": "fake", "version": "0", "extensions": ["a"]}
    assert servicer.unavailable_left == 0
    servicer.unavailable_left = 5
    with Client(url, retry=FAST, budget=RetryBudget(burst=100)) as client, pytest.raises(ServerUnavailable):
        client.server_metadata()
    assert servicer.unavailable_left == 2  # three attempts


def test_deadline_is_timeout(fake: tuple[str, _Servicer]) -> None:
    url, _ = fake
    with Client(url, timeout=0.2) as client, pytest.raises(Timeout):
        client.model_metadata("m")


async def test_async_round_trip_and_deadline(fake: tuple[str, _Servicer]) -> None:
    url, servicer = fake
    async with AsyncClient(url, headers={"X-Team": "ml"}) as client:
        assert await client.server_live()
        result = await client.infer("m", {"INPUT0": np.ones((1, 2), np.int64)}, request_id="aq")
    async with AsyncClient(url, timeout=0.2) as client:
        with pytest.raises(Timeout):
            await client.model_metadata("m")
    assert result.id == "aq"
    assert result["INPUT0"].dtype == np.int64
    assert servicer.metadata[0]["x-team"] == "ml"
