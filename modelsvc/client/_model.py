"""Model handles: the model's metadata read once, inputs checked locally before anything is sent.

A handle sends through the client that made it; :class:`InferClient` and :class:`AsyncInferClient` say
what it needs of that client (``Client`` and ``AsyncClient`` are them), so handles know nothing else of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..protocol import Tensor
from ._core import InferResult, ModelMetadata, check_inputs, check_outputs


class InferClient(Protocol):
    """What ``Model`` needs of its client (a ``Client``): one inference call, with retries and tracing."""

    def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult: ...


class AsyncInferClient(Protocol):
    """What ``AsyncModel`` needs of its client (an ``AsyncClient``): the awaited twin of ``InferClient``."""

    async def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult: ...


class _Handle:
    """What both handles share: the metadata and the checks."""

    def __init__(self, metadata: ModelMetadata, version: str | None) -> None:
        self.metadata = metadata
        self.name = metadata.name
        self.version = version

    @property
    def inputs(self) -> dict[str, str]:
        """Input names and their datatypes."""
        return {s.name: s.datatype for s in self.metadata.inputs}

    @property
    def outputs(self) -> dict[str, str]:
        return {s.name: s.datatype for s in self.metadata.outputs}

    def _prepare(
        self, inputs: Mapping[str, Any] | None, named: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> tuple[list[Any], list[str] | None]:
        values = {**(inputs or {}), **named}
        tensors = check_inputs(self.metadata, values)
        return tensors, None if outputs is None else check_outputs(self.metadata, outputs)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.metadata.inputs)
        outs = ", ".join(str(s) for s in self.metadata.outputs)
        return f"<model {self.name!r} inputs: {ins}; outputs: {outs}>"


class Model(_Handle):
    """``client.model("name")``; then ``model.infer(INPUT0=array)`` or ``model.infer({"INPUT0": array})``."""

    def __init__(self, client: InferClient, metadata: ModelMetadata, version: str | None) -> None:
        super().__init__(metadata, version)
        self._client = client

    def infer(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> dict[str, Any]:
        """The outputs by name, as numpy arrays."""
        return self.infer_result(
            inputs, outputs=outputs, request_id=request_id, parameters=parameters, timeout=timeout, **named
        ).outputs

    def infer_result(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> InferResult:
        """Like ``infer``, with the answer's model version, id and parameters."""
        tensors, wanted = self._prepare(inputs, named, outputs)
        return self._client._infer(self.name, self.version, tensors, wanted, request_id, parameters, timeout)


class AsyncModel(_Handle):
    """The asyncio twin of ``Model``."""

    def __init__(self, client: AsyncInferClient, metadata: ModelMetadata, version: str | None) -> None:
        super().__init__(metadata, version)
        self._client = client

    async def infer(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> dict[str, Any]:
        result = await self.infer_result(
            inputs, outputs=outputs, request_id=request_id, parameters=parameters, timeout=timeout, **named
        )
        return result.outputs

    async def infer_result(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> InferResult:
        tensors, wanted = self._prepare(inputs, named, outputs)
        return await self._client._infer(self.name, self.version, tensors, wanted, request_id, parameters, timeout)
