"""What the gRPC endpoint's tests share (tests/server/test_grpc_server*.py): a server's address, tritonclient's client
and grpcio's stub on the session's server (module fixtures: ``client = _grpc.client``, ``stub``), raw requests,
and what the server's metrics and statistics say.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests._server import ModelsvcProcess

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


def raw_request(model: str, inputs: list[tuple[str, str, list[int]]], raws: list[bytes], **fields: Any) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raws)
    return request


FP32_ROW = ROW.tobytes()
ONE = [("INPUT0", "FP32", [1, 16])]


def executions(proc: ModelsvcProcess, model: str) -> int:
    return int(httpx.get(f"{proc.base}/v2/models/{model}/stats").json()["model_stats"][0]["execution_count"])
