"""modelsvc.client against a real Triton 2.51, over HTTP and gRPC, sync and async: the same answers and the same
exceptions whichever binding carries them."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from modelsvc.client import (
    AsyncClient,
    Client,
    ClientError,
    ConnectError,
    InvalidInput,
    ModelNotFound,
    RetryBudget,
    RetryPolicy,
    TensorSpec,
)

from ._triton import Triton, triton

__all__ = ["triton"]  # the session fixture, used by ``url``

pytestmark = pytest.mark.integration

SCHEMES = ["http", "grpc"]
ROWS = np.arange(32, dtype=np.float32).reshape(2, 16)
TEXT = np.array([["héllo", "wörld"], ["a", ""]], dtype=object)
RAW = np.array([[b"\xff\x00\x01", b"bin"]], dtype=object)


def _answer(error: ClientError) -> tuple[int | None, str | None]:
    return error.status, error.code


def _by_scheme(url: str, status: int, code: str) -> tuple[int | None, str | None]:
    """What Triton answers: an HTTP status over HTTP, a gRPC code over gRPC."""
    return (status, None) if url.startswith("http") else (None, code)


@pytest.fixture(params=SCHEMES)
def url(request: pytest.FixtureRequest, triton: Triton) -> str:
    return triton.url(request.param)


# -- sync ----------------------------------------------------------------------------------------------------


def test_server_live_ready_metadata(url: str) -> None:
    with Client(url, headers={"X-Interop": "1"}) as client:
        assert client.server_live()
        assert client.server_ready()
        assert client.model_ready("identity_fp32")
        assert not client.model_ready("no_such_model")
        meta = client.server_metadata()
    assert meta["name"] == "triton"
    assert meta["version"] == "2.51.0"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_is_typed(url: str) -> None:
    with Client(url) as client:
        meta = client.model("identity_fp32").metadata
        config = client.model_config("add_sub")
    assert meta.name == "identity_fp32"
    assert meta.versions == ("1",)
    assert meta.platform == "python"
    assert meta.inputs == (TensorSpec("INPUT0", "FP32", (-1, 16)),)
    assert meta.outputs == (TensorSpec("OUTPUT0", "FP32", (-1, 16)),)
    assert meta.max_batch_size == 8
    assert config["max_batch_size"] == 8
    assert config["backend"] == "python"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]),
        ("INPUT1", "TYPE_FP32", [16]),
    ]


def test_infer_fp32_echoes_request_id(url: str) -> None:
    with Client(url) as client:
        model = client.model("identity_fp32")
        result = model.infer_result(INPUT0=ROWS)
        tagged = client.infer("identity_fp32", {"INPUT0": ROWS[:1]}, request_id="req-42")
    assert result.model_name == "identity_fp32"
    assert result.model_version == "1"
    assert result.datatypes == {"OUTPUT0": "FP32"}
    np.testing.assert_array_equal(result["OUTPUT0"], ROWS)
    assert result["OUTPUT0"].dtype == np.float32
    assert tagged.id == "req-42"
    np.testing.assert_array_equal(tagged["OUTPUT0"], ROWS[:1])


def test_infer_bytes(url: str) -> None:
    with Client(url) as client:
        model = client.model("identity_bytes")
        text = model.infer(INPUT0=TEXT)["OUTPUT0"]
        raw = model.infer(INPUT0=RAW)["OUTPUT0"]
    assert text.shape == (2, 2)
    assert text.tolist() == [[s.encode() for s in row] for row in TEXT.tolist()]
    assert raw.tolist() == RAW.tolist()


def test_infer_add_sub_output_subsets(url: str) -> None:
    a, b = ROWS, np.full((2, 16), 2.0, np.float32)
    with Client(url) as client:
        model = client.model("add_sub")
        both = model.infer_result(INPUT0=a, INPUT1=b)
        only_sub = model.infer_result(INPUT0=a, INPUT1=b, outputs=["OUTPUT1"])
    assert set(both.outputs) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(both["OUTPUT0"], a + b)
    np.testing.assert_array_equal(both["OUTPUT1"], a - b)
    assert set(only_sub.outputs) == {"OUTPUT1"}
    assert only_sub.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only_sub["OUTPUT1"], a - b)


def test_invalid_input_locally_and_from_the_server(url: str) -> None:
    with Client(url) as client:
        model = client.model("identity_fp32")
        with pytest.raises(InvalidInput, match=r"expected \[-1, 16\]") as local:
            model.infer(INPUT0=np.ones((1, 3), np.float32))
        with pytest.raises(InvalidInput, match="no output 'NOPE'"):
            model.infer(INPUT0=ROWS, outputs=["NOPE"])
        with pytest.raises(InvalidInput, match="unexpected shape") as remote:
            client.infer("identity_fp32", {"INPUT0": np.ones((1, 3), np.float32)})
    assert local.value.status is None  # never sent
    assert local.value.code is None
    assert _answer(remote.value) == _by_scheme(url, 400, "INVALID_ARGUMENT")


def test_unknown_model(url: str) -> None:
    with Client(url) as client:
        with pytest.raises(ModelNotFound, match="unknown model") as meta:
            client.model("no_such_model")
        with pytest.raises(ModelNotFound, match="unknown model"):
            client.infer("no_such_model", {"INPUT0": ROWS})
        with pytest.raises(ModelNotFound, match="version 7 is not found"):
            client.model_metadata("identity_fp32", version="7")
    assert _answer(meta.value) == _by_scheme(url, 404, "NOT_FOUND")


# -- async ---------------------------------------------------------------------------------------------------


async def test_async_health_and_metadata(url: str) -> None:
    async with AsyncClient(url) as client:
        assert await client.server_live()
        assert await client.server_ready()
        assert await client.model_ready("add_sub")
        assert not await client.model_ready("no_such_model")
        assert (await client.server_metadata())["version"] == "2.51.0"
        model = await client.model("add_sub")
    assert model.metadata.max_batch_size == 8
    assert [s.name for s in model.metadata.inputs] == ["INPUT0", "INPUT1"]


async def test_async_infer(url: str) -> None:
    b = np.ones((2, 16), np.float32)
    async with AsyncClient(url) as client:
        identity = await client.model("identity_fp32")
        add_sub = await client.model("add_sub")
        fp32 = await identity.infer_result(INPUT0=ROWS)
        tagged = await client.infer("identity_fp32", {"INPUT0": ROWS}, request_id="async-7")
        text = await client.infer("identity_bytes", {"INPUT0": TEXT})
        only_add = await add_sub.infer_result(INPUT0=ROWS, INPUT1=b, outputs=["OUTPUT0"])
    np.testing.assert_array_equal(fp32["OUTPUT0"], ROWS)
    assert tagged.id == "async-7"
    assert text["OUTPUT0"].tolist() == [[s.encode() for s in row] for row in TEXT.tolist()]
    assert set(only_add.outputs) == {"OUTPUT0"}
    np.testing.assert_array_equal(only_add["OUTPUT0"], ROWS + b)


async def test_async_errors(url: str) -> None:
    async with AsyncClient(url) as client:
        model = await client.model("identity_fp32")
        with pytest.raises(InvalidInput, match=r"expected \[-1, 16\]"):
            await model.infer(INPUT0=np.ones((1, 3), np.float32))
        with pytest.raises(ModelNotFound, match="unknown model"):
            await client.model("no_such_model")
        with pytest.raises(ModelNotFound, match="unknown model"):
            await client.infer("no_such_model", {"INPUT0": ROWS})


# -- gRPC faults (no server needed) ----------------------------------------------------------------------------


class _Counting(RetryPolicy):
    """A fast policy that records each failed attempt it was asked about."""

    __slots__ = ()
    seen: list[ClientError] = []  # noqa: RUF012 - one list per test, reset by the fixture

    def should_retry(self, error: ClientError, attempt: int) -> bool:
        self.seen.append(error)
        return super().should_retry(error, attempt)


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"grpc://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def counting() -> _Counting:
    _Counting.seen = []
    return _Counting(attempts=3, backoff_s=0.001, max_backoff_s=0.005)


def test_grpc_closed_port_is_connect_error_after_the_attempts(closed_port: str, counting: _Counting) -> None:
    start = time.monotonic()
    with (
        Client(closed_port, retry=counting, budget=RetryBudget(burst=100), timeout=10) as client,
        pytest.raises(ConnectError, match="connection failed") as caught,
    ):
        client.infer("identity_fp32", {"INPUT0": ROWS})
    assert len(counting.seen) == 3
    assert all(isinstance(e, ConnectError) for e in counting.seen)
    assert caught.value.code == "UNAVAILABLE"
    assert time.monotonic() - start < 5
    with Client(closed_port, retry=counting, timeout=10) as client:
        assert not client.server_live()


async def test_async_grpc_closed_port_is_connect_error(closed_port: str, counting: _Counting) -> None:
    async with AsyncClient(closed_port, retry=counting, budget=RetryBudget(burst=100), timeout=10) as client:
        with pytest.raises(ConnectError, match="connection failed"):
            await client.server_metadata()
    assert len(counting.seen) == 3
