"""Embedded mode: the modelsvc engine inside the logic server's process, behind the client's own API.

``model_service: embedded`` starts the engine on the service's model repository and hands the client a
binding that calls the data plane directly: no network hop and no serialization (tensors pass as numpy
arrays), the same validation, batching, errors and statistics as the model service itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from modelsvc.client import ClientError, InferCall, InferReply, InferResult, Timeout
from modelsvc.client._errors import error_from_http
from modelsvc.engine import DataPlane, ModelManager, http_error
from modelsvc.protocol import ModelsvcError
from modelsvc.repository import ModelRepository
from modelsvc.server import Metrics


class EmbeddedModelService:
    """Loads a model repository in-process; ``binding()`` gives the client its way in.

    engine = EmbeddedModelService(Path("model_repository"))
    await engine.start()
    client = AsyncClient(binding=engine.binding())
    """

    def __init__(self, repository: Path, *, strict_model_config: bool = False) -> None:
        self.repository = repository
        self.models = ModelManager(ModelRepository(repository, strict_model_config=strict_model_config))
        self.dataplane = DataPlane(self.models)
        self.metrics = Metrics(self.models)
        """The model service's own metrics (nv_* families), for the logic server to expose."""

    async def start(self) -> None:
        """Load every model; a model that fails to load is an error here (as --exit-on-error true)."""
        errors = await self.models.load_all()
        if errors:
            await self.models.close()
            raise RuntimeError("embedded model service: " + "; ".join(errors))
        self.dataplane.accepting = True

    async def close(self) -> None:
        self.dataplane.draining = True
        await self.models.close()

    def binding(self) -> EmbeddedBinding:
        return EmbeddedBinding(self.dataplane, str(self.repository))


def _client_error(exc: ModelsvcError) -> ClientError:
    """The exception the client would raise had the same error come over HTTP."""
    status, message = http_error(exc)
    return error_from_http(status, message)


class EmbeddedBinding:
    """``modelsvc.client``'s AsyncTransport over an in-process DataPlane."""

    scheme = "embedded"

    def __init__(self, dataplane: DataPlane, server: str) -> None:
        self.dataplane = dataplane
        self.server = server

    async def live(self, timeout: float | None) -> bool:
        return self.dataplane.live()

    async def ready(self, timeout: float | None) -> bool:
        return self.dataplane.ready()

    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        return self.dataplane.model_ready(name, version)

    async def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return self.dataplane.server_metadata()

    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        try:
            return self.dataplane.model_metadata(name, version)
        except ModelsvcError as exc:
            raise _client_error(exc) from None

    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        try:
            return self.dataplane.model_config(name, version)
        except ModelsvcError as exc:
            raise _client_error(exc) from None

    async def infer(self, call: InferCall) -> InferReply:
        request = call.request()
        try:
            # the timeout cancels the call, which withdraws the request from its model's queue
            response = await asyncio.wait_for(self.dataplane.infer(call.model, call.version, request), call.timeout)
        except ModelsvcError as exc:
            raise _client_error(exc) from None
        except TimeoutError:
            raise Timeout(f"model {call.model!r} did not answer within {call.timeout} s") from None
        result = InferResult.from_response(response)
        sent = sum(t.data.nbytes for t in request.inputs)
        received = sum(t.data.nbytes for t in response.outputs)
        return InferReply(result, sent, received)

    async def close(self) -> None:
        """The engine belongs to EmbeddedModelService; closing the client leaves it running."""
