"""modelsvc.client against a real MLServer: v2 JSON only (no binary extension, no /config), so the client
must find out by itself that it has to speak JSON, and must do without the model's config.

MLServer runs from its own virtual environment (``.venv-mlserver/``, created on first use); without a
reachable package index these tests skip, or fail under ``MODELSVC_INTEROP=1`` (CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from modelsvc.client import (
    AsyncClient,
    Client,
    InvalidInput,
    ModelNotFound,
    ServerError,
)
from modelsvc.client._core import error_from_body

from ._mlserver import MLServerProcess, ensure_env

# the first run creates MLServer's environment (about 10 s with uv, a minute with pip): the default 120 s may not do
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WORDS = ["a", "naïve", "", "tab\there"]


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerProcess]:
    executable = ensure_env()
    with MLServerProcess(executable, tmp_path_factory.mktemp("mlserver")) as proc:
        yield proc


class RecordingTransport(httpx.HTTPTransport):
    """The real transport, recording each request's method, path and content type."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, str | None]] = []
        self.binary_headers = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path, request.headers.get("content-type")))
        self.binary_headers += "inference-header-content-length" in request.headers
        return super().handle_request(request)


class AsyncRecordingTransport(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, str | None]] = []
        self.binary_headers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path, request.headers.get("content-type")))
        self.binary_headers += "inference-header-content-length" in request.headers
        return await super().handle_async_request(request)


def _posts(sent: list[tuple[str, str, str | None]]) -> list[tuple[str, str | None]]:
    return [(path, content_type) for method, path, content_type in sent if method == "POST"]


def test_server_lists_no_binary_extension(mlserver: MLServerProcess) -> None:
    with Client(mlserver.url) as client:
        assert client.server_live()
        assert client.server_ready()
        meta = client.server_metadata()
        assert meta["name"] == "mlserver"
        assert "binary_tensor_data" not in meta["extensions"]
        assert client.model_ready("echo")
        assert not client.model_ready("nope")
        with pytest.raises(ModelNotFound):  # no configuration extension: FastAPI's 404 for the route
            client.model_config("echo")


def test_model_handle_without_config_and_json_round_trip(mlserver: MLServerProcess) -> None:
    transport = RecordingTransport()
    with Client(mlserver.url, transport=transport) as client:
        model = client.model("echo")
        assert model.metadata.max_batch_size is None  # from metadata alone: MLServer has no /config
        assert model.inputs == {"INPUT0": "FP32", "TEXT": "BYTES"}
        assert model.outputs == {"OUTPUT0": "FP32", "TEXT_OUT": "BYTES"}
        assert ("GET", "/v2/models/echo/config", None) in transport.sent  # asked once, did without

        numbers = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
        out = model.infer(INPUT0=numbers, TEXT=WORDS)
        assert out["OUTPUT0"].dtype == np.float32
        assert np.array_equal(out["OUTPUT0"], numbers)  # JSON floats round-trip FP32 exactly
        assert out["TEXT_OUT"].dtype == object
        assert out["TEXT_OUT"].tolist() == [w.encode() for w in WORDS]

        out = model.infer({"INPUT0": [[1.5, -2, 0, 3e38]], "TEXT": [b"bytes\x00in"]})  # plain Python values
        assert out["OUTPUT0"].tolist() == [[1.5, -2.0, 0.0, np.float32(3e38)]]
        assert out["TEXT_OUT"].tolist() == [b"bytes\x00in"]

        result = client.infer("echo", {"INPUT0": numbers[:1], "TEXT": ["x"]}, request_id="r-1")
        assert result.model_name == "echo"
        assert result.id == "r-1"

    posts = _posts(transport.sent)
    assert posts == [("/v2/models/echo/infer", "application/json")] * 3
    assert transport.binary_headers == 0
    assert transport.sent.count(("GET", "/v2", None)) == 1  # extensions asked once, on the first infer


async def test_async_client_uses_json_too(mlserver: MLServerProcess) -> None:
    transport = AsyncRecordingTransport()
    async with AsyncClient(mlserver.url, transport=transport) as client:
        model = await client.model("echo")
        assert model.metadata.max_batch_size is None
        numbers = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
        out = await model.infer(INPUT0=numbers, TEXT=["ünïcode", "b"])
        assert np.array_equal(out["OUTPUT0"], numbers)
        assert out["TEXT_OUT"].tolist() == ["ünïcode".encode(), b"b"]
        with pytest.raises(ModelNotFound, match="nope"):
            await client.model("nope")
        with pytest.raises(InvalidInput):
            await model.infer(INPUT0=numbers.astype(np.float64), TEXT=["a"])
    assert _posts(transport.sent) == [("/v2/models/echo/infer", "application/json")]
    assert transport.binary_headers == 0


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"INPUT0": np.zeros((1, 4), np.float64), "TEXT": ["a"]}, "FP32"),  # wrong dtype
        ({"INPUT0": np.zeros((1, 3), np.float32), "TEXT": ["a"]}, "shape"),  # wrong shape
        ({"INPUT0": np.zeros((1, 4), np.float32)}, "needs input"),  # missing input
        ({"INPUT0": np.zeros((1, 4), np.float32), "TEXT": ["a"], "EXTRA": [1]}, "no input 'EXTRA'"),
        ({"INPUT0": np.zeros((1, 4), np.float32), "TEXT": [1, 2]}, "BYTES"),  # numbers for text
        ({"INPUT0": np.zeros((1, 4), np.float32), "TEXT": [b"\xff"]}, "UTF-8"),  # JSON cannot carry it
    ],
)
def test_invalid_input_is_refused_before_sending(
    mlserver: MLServerProcess, values: dict[str, object], words: str
) -> None:
    transport = RecordingTransport()
    with Client(mlserver.url, transport=transport) as client:
        model = client.model("echo")
        before = len(transport.sent)
        with pytest.raises(InvalidInput, match=words) as info:
            model.infer(values)
        assert info.value.status is None  # local: no server answered
        assert _posts(transport.sent[before:]) == []


def test_unknown_model_and_version(mlserver: MLServerProcess) -> None:
    with Client(mlserver.url) as client:
        with pytest.raises(ModelNotFound, match="Model nope not found") as info:
            client.model("nope")
        assert info.value.status == 404
        with pytest.raises(ModelNotFound, match="nope"):
            client.infer("nope", {"INPUT0": np.zeros((1, 4), np.float32)})
        with pytest.raises(ModelNotFound, match="version 9"):
            client.model("echo", version="9")


def test_server_side_errors_map_into_the_tree(mlserver: MLServerProcess) -> None:
    with Client(mlserver.url) as client:
        # the untyped path skips local checks; MLServer's model fails on the missing input: a bare 500
        with pytest.raises(ServerError) as info:
            client.infer("echo", {"INPUT0": np.zeros((1, 4), np.float32)})
        assert info.value.status == 500
    # MLServer's request validation answers 422 with FastAPI's {"detail": [...]}
    answer = httpx.post(
        f"{mlserver.base}/v2/models/echo/infer",
        content=b'{"inputs": 5}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 422
    error = error_from_body(answer.status_code, answer.content)
    assert isinstance(error, InvalidInput)
    assert "inputs" in error.message


def test_environment_is_reused(mlserver: MLServerProcess) -> None:
    """The session's env creation left a marker, so the next run starts MLServer without pip."""
    from loadtests.harness._servers import marker_of

    from ._mlserver import VENV

    assert marker_of(VENV).exists()
    assert ensure_env() == VENV / "bin" / "mlserver"
    assert Path(mlserver.log_path).read_text().count("Loaded model 'echo'") == 1
