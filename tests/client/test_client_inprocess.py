"""The client's in-process binding over a stand-in model service (no engine): one call in, one reply out, and
the model service's error kinds mapped straight to the client's errors, as the same call over HTTP fails."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from modelsvc.client import (
    AsyncClient,
    ClientError,
    InferCall,
    InferReply,
    InProcessTransport,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from modelsvc.protocol import (
    ERROR_TYPES,
    ErrorKind,
    InferRequest,
    InferResponse,
    InProcessService,
    ModelsvcError,
    NotFound,
    Tensor,
    Unavailable,
)


class Echo:
    """A model service that echoes its inputs, fails with ``error`` when set, or never answers when ``hang``."""

    def __init__(self) -> None:
        self.error: ModelsvcError | None = None
        self.hang = False
        self.cancelled = 0
        self.requests: list[InferRequest] = []

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return InferResponse(model_name=name, model_version="1", outputs=list(request.inputs), id=request.id)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return name == "echo"

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "echo-service", "version": "0", "extensions": []}

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        if name != "echo":
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        spec = {"name": "X", "datatype": "FP32", "shape": [-1]}
        return {"name": name, "versions": ["1"], "platform": "echo", "inputs": [spec], "outputs": [spec]}

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        self.model_metadata(name, version)
        return {"name": name, "max_batch_size": 0}


def _transport(service: InProcessService) -> InProcessTransport:
    return InProcessTransport(service, "here")


async def test_one_call_in_one_reply_out() -> None:
    service = Echo()
    x = np.arange(4, dtype=np.float32)
    call = InferCall("echo", None, [Tensor("X", "FP32", (4,), x)], ["X"], "r1", {"p": 1}, timeout=1.0)
    reply = await _transport(service).infer(call)
    assert isinstance(reply, InferReply)
    assert reply.result["X"] is x  # the array itself travels: no copy
    assert (reply.result.id, reply.bytes_sent, reply.bytes_received) == ("r1", 16, 16)
    (request,) = service.requests
    assert request.parameters == {"p": 1}
    assert [o.name for o in request.outputs or ()] == ["X"]


# what the model service answers over HTTP for each kind, and so what the client raises in-process
EXPECTED: dict[ErrorKind, tuple[type[ClientError], int]] = {
    ErrorKind.INVALID_ARGUMENT: (InvalidInput, 400),
    ErrorKind.NOT_FOUND: (ModelNotFound, 404),
    ErrorKind.UNAVAILABLE: (ServerUnavailable, 503),
    ErrorKind.UNSUPPORTED: (InvalidInput, 400),
    ErrorKind.INTERNAL: (ServerError, 500),
    ErrorKind.ALREADY_EXISTS: (InvalidInput, 400),
    ErrorKind.CANCELLED: (InvalidInput, 400),
    ErrorKind.UNKNOWN: (InvalidInput, 400),
}


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.value)
async def test_each_error_kind_is_the_clients_error_as_over_http(kind: ErrorKind) -> None:
    service = Echo()
    service.error = ERROR_TYPES[kind]("it failed")
    with pytest.raises(ClientError) as info:
        await _transport(service).infer(InferCall("echo", None, []))
    error_type, status = EXPECTED[kind]
    assert type(info.value) is error_type
    assert (info.value.message, info.value.status) == ("it failed", status)


async def test_a_full_queue_is_queue_full() -> None:
    service = Echo()
    service.error = Unavailable("Exceeds maximum queue size")
    with pytest.raises(QueueFull):
        await _transport(service).infer(InferCall("echo", None, []))


async def test_the_timeout_cancels_the_call_in_the_service() -> None:
    service = Echo()
    service.hang = True
    with pytest.raises(Timeout):
        await _transport(service).infer(InferCall("echo", None, [], timeout=0.05))
    assert service.cancelled == 1


async def test_the_whole_client_api_over_the_binding() -> None:
    async with AsyncClient(binding=_transport(Echo())) as client:
        assert await client.server_live()
        assert await client.server_ready()
        assert await client.model_ready("echo")
        model = await client.model("echo")
        out = await model.infer(X=np.ones(3, np.float32))
        assert out["X"].tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(ModelNotFound) as info:
            await client.model("nope")
        assert info.value.status == 404
