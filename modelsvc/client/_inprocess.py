"""The in-process binding: a model service in this very process (an engine's ``DataPlane``), called directly.

``AsyncClient(binding=InProcessTransport(dataplane, "model_repository"))`` gives the client's whole API over an
engine loaded in the caller's process, as the logic server's embedded mode does: no network hop and no
serialization (tensors pass as numpy arrays), the same validation, batching, statistics and errors as over HTTP.
The client never imports the engine: the transport is typed by ``modelsvc.protocol.InProcessService``, which
the engine's data plane satisfies, as BLS reaches the data plane through ``InProcessTarget``.

Errors come as the model service's own kinds and are mapped straight to the client's (``error_from_kind``). The
call's timeout cancels the request, which withdraws it from its model's queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..protocol import InProcessService, ModelsvcError
from ._core import InferCall, InferReply, InferResult
from ._errors import Timeout, error_from_kind


class InProcessTransport:
    """``modelsvc.client``'s AsyncTransport over a model service in this process; ``close()`` leaves it running
    (the engine belongs to whoever started it)."""

    def __init__(self, service: InProcessService, server: str, *, scheme: str = "inprocess") -> None:
        self.service = service
        self.server = server
        """What spans and messages name as the server (a model repository, say)."""
        self.scheme = scheme

    async def live(self, timeout: float | None) -> bool:
        return self.service.live()

    async def ready(self, timeout: float | None) -> bool:
        return self.service.ready()

    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        return self.service.model_ready(name, version)

    async def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return self.service.server_metadata()

    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        try:
            return self.service.model_metadata(name, version)
        except ModelsvcError as exc:
            raise error_from_kind(exc) from None

    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        try:
            return self.service.model_config(name, version)
        except ModelsvcError as exc:
            raise error_from_kind(exc) from None

    async def infer(self, call: InferCall) -> InferReply:
        request = call.request()
        try:
            if call.timeout is None:
                response = await self.service.infer(call.model, call.version, request)
            else:  # cancels the call in this task when the time is up: no task of its own per call
                async with asyncio.timeout(call.timeout):
                    response = await self.service.infer(call.model, call.version, request)
        except ModelsvcError as exc:
            raise error_from_kind(exc) from None
        except TimeoutError:
            raise Timeout(f"model {call.model!r} did not answer within {call.timeout} s") from None
        sent = sum(t.data.nbytes for t in request.inputs)
        received = sum(t.data.nbytes for t in response.outputs)
        return InferReply(InferResult.from_response(response), sent, received)

    async def close(self) -> None:
        """The service belongs to whoever started it: closing the client leaves it running."""
