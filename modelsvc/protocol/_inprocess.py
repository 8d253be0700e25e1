"""The model service as code in its own process sees it: no socket, no serialization, the numpy arrays travel.

Two callers run beside the engine without importing it: a python model calling other models (BLS,
``modelsvc.backends``) and the client's in-process transport (``modelsvc.client``, the logic server's embedded
mode). Each is typed by a Protocol here, below both, which the engine's ``DataPlane`` satisfies as it is: its
``infer`` takes more (a trace, the door's name) with defaults, and errors come as ``ModelsvcError`` of a kind.
"""

from __future__ import annotations

from typing import Any, Protocol

from ._types import InferRequest, InferResponse


class InProcessTarget(Protocol):
    """What BLS needs of the data plane: run one request, and say whether a model is ready."""

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse: ...

    def model_ready(self, name: str, version: str | None = None) -> bool: ...


class InProcessService(InProcessTarget, Protocol):
    """The whole model service in-process, as the client's in-process transport calls it: BLS's two calls, health
    and metadata. Metadata and config raise ``NotFound`` for an unknown model, as the doors answer 404."""

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def server_metadata(self) -> dict[str, Any]: ...

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]: ...

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]: ...
