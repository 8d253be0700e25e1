"""modelsvc.client against a real modelsvc server: typed handles, local checks, errors, sync and async."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from modelsvc.client import (
    NO_RETRY,
    AsyncClient,
    Client,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    ServerUnavailable,
)

pytestmark = pytest.mark.integration


class CountingTransport(httpx.HTTPTransport):
    """The real transport, counting the requests that reach the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


@pytest.fixture(scope="module")
def client(server):
    with Client(server.url) as c:
        yield c


def test_server_endpoints(client):
    assert client.server_live()
    assert client.server_ready()
    assert client.server_metadata()["name"] == "modelsvc"
    assert client.model_ready("identity")
    assert not client.model_ready("nope")
    assert client.model_config("identity")["max_batch_size"] == 8


def test_model_handle_reads_metadata_once_and_infers(server):
    transport = CountingTransport()
    with Client(server.url, transport=transport) as c:
        model = c.model("add_sub")
        assert model.inputs == {"INPUT0": "FP32", "INPUT1": "FP32"}
        assert model.metadata.max_batch_size == 8
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        out = model.infer(INPUT0=a, INPUT1=np.ones_like(a))  # the first call also asks GET /v2, once
        assert np.array_equal(out["OUTPUT0"], a + 1)
        assert np.array_equal(out["OUTPUT1"], a - 1)
        before = len(transport.sent)
        out = model.infer({"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT1"])
        assert set(out) == {"OUTPUT1"}
        model.infer(INPUT0=a, INPUT1=a)
        assert transport.sent[before:] == ["POST /v2/models/add_sub/infer"] * 2  # no metadata read per call


def test_plain_python_values_and_datatypes(client):
    out = client.model("identity").infer(INPUT0=[[float(i) for i in range(16)]])
    assert out["OUTPUT0"].dtype == np.float32
    assert out["OUTPUT0"][0, 15] == 15.0
    words = client.model("identity_bytes").infer(INPUT0=[["a", b"b\x00", "naïve", ""]])["OUTPUT0"]
    assert words.tolist() == [[b"a", b"b\x00", "naïve".encode(), b""]]
    half = np.array([[0.5, 1.5, -2.0, 65504.0]], np.float16)
    assert np.array_equal(client.model("identity_fp16").infer(INPUT0=half)["OUTPUT0"], half)
    bf16 = client.model("identity_bf16").infer(INPUT0=[[1.5, -2.0, 0.0078125, 2.0**100]])["OUTPUT0"]
    assert bf16.astype(np.float32).tolist() == [[1.5, -2.0, 0.0078125, 2.0**100]]
    flags = client.model("identity_bool").infer(INPUT0=[[True, False, True, True]])["OUTPUT0"]
    assert flags.dtype == np.bool_


def test_json_mode_gives_the_same_answers(server):
    with Client(server.url, binary=False) as c:
        model = c.model("identity_bytes")
        assert model.infer(INPUT0=[["x", "y", "z", "w"]])["OUTPUT0"].tolist() == [[b"x", b"y", b"z", b"w"]]
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        assert np.array_equal(c.infer("identity", {"INPUT0": a})["OUTPUT0"], a)


def test_untyped_infer_and_result_details(client):
    a = np.ones((1, 16), np.float32)
    result = client.infer("identity", {"INPUT0": a}, request_id="r-1")
    assert result.id == "r-1"
    assert result.model_version == "1"
    assert result.datatypes == {"OUTPUT0": "FP32"}
    assert np.array_equal(result.as_numpy("OUTPUT0"), a)


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        ({"INPUT9": np.ones((1, 16), np.float32)}, ["no input 'INPUT9'", "INPUT0 (FP32 [-1, 16])"]),
        ({"INPUT0": np.ones((1, 16), np.float64)}, ["FP32", "float64"]),
        ({"INPUT0": np.ones((1, 17), np.float32)}, ["[1, 17]", "[-1, 16]"]),
        ({"INPUT0": np.ones((9, 16), np.float32)}, ["max_batch_size 8"]),
        ({"INPUT0": [["a"] * 16]}, ["FP32"]),
        ({}, ["needs input(s) INPUT0 (FP32 [-1, 16])"]),
        ({"INPUT0": [[True] * 16]}, ["true/false"]),
    ],
    ids=["name", "datatype", "shape", "batch", "strings", "missing", "bools"],
)
def test_bad_inputs_fail_locally_before_any_request(server, inputs, fragments):
    transport = CountingTransport()
    with Client(server.url, transport=transport) as c:
        model = c.model("identity")
        sent = len(transport.sent)
        with pytest.raises(InvalidInput) as info:
            model.infer(inputs)
        assert len(transport.sent) == sent  # nothing went out
        for fragment in fragments:
            assert fragment in str(info.value)


def test_plain_values_that_would_change_are_refused(client):
    ints = client.model("identity_int64")
    with pytest.raises(InvalidInput, match="fractional"):
        ints.infer(INPUT0=[[1.7, -2.9, 3.0, 4.0]])
    with pytest.raises(InvalidInput, match="true/false"):
        ints.infer(INPUT0=[[True, False, True, False]])
    with pytest.raises(InvalidInput, match="numbers"):
        client.model("identity_bool").infer(INPUT0=[[2, 0, 1, 1]])
    with pytest.raises(InvalidInput, match="outside"):
        client.model("identity_int8").infer(INPUT0=[[1, 2, 3, 300]])
    assert ints.infer(INPUT0=[[1, -2, 3, 4]])["OUTPUT0"].tolist() == [[1, -2, 3, 4]]


def test_server_errors_map_to_the_tree(client):
    with pytest.raises(ModelNotFound) as info:
        client.model("nope")
    assert info.value.status == 404
    with pytest.raises(InvalidInput) as bad:
        client.infer("identity_bytes", {"INPUT0": np.array([[b"\xff", b"a", b"b", b"c"]], dtype=object)})
    assert bad.value.status == 400
    assert "UTF-8" in str(bad.value)


def test_queue_timeout_is_queue_full_and_not_retried_when_told(server):
    with Client(server.url, retry=NO_RETRY) as c, pytest.raises(QueueFull) as info:
        c.infer("timed", {"INPUT0": np.ones((1, 16), np.float32)})
    assert info.value.status == 503
    assert isinstance(info.value, ServerUnavailable)


async def test_async_client_and_model(server):
    async with AsyncClient(server.url) as c:
        assert await c.server_ready()
        model = await c.model("add_sub")
        a = np.ones((1, 16), np.float32)
        out = await model.infer(INPUT0=a, INPUT1=a)
        assert np.array_equal(out["OUTPUT0"], a * 2)
        result = await c.infer("identity", {"INPUT0": a}, request_id="x")
        assert result.id == "x"
        with pytest.raises(InvalidInput, match="no input 'NOPE'"):
            await model.infer(NOPE=a)
        with pytest.raises(ModelNotFound):
            await c.model_metadata("nope")
