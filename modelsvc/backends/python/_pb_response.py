"""pb_utils responses and what requests share with them: ``InferenceResponse``, parameters as Triton's JSON,
the ``TRITONSERVER_*`` flags, ``PreferredMemory`` and ``InferenceTrace``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._pb_errors import TritonError, TritonModelException
from ._pb_tensor import Tensor

if TYPE_CHECKING:
    from modelsvc.protocol import InferResponse

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1


def _parameters_json(parameters: dict[str, Any] | None) -> str:
    """Request or response parameters as Triton's JSON string; values must be bool, int or str."""
    if not parameters:
        return "{}"
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"parameter {key!r}: keys must be str and values bool, int or str, got {type(value).__name__}"
            )
    return json.dumps(parameters)


class InferenceResponse:
    """The answer to one request: output tensors, or an error that fails that request alone."""

    __slots__ = ("_error", "_outputs", "_parameters")

    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self._outputs = list(output_tensors) if output_tensors is not None else []
        self._error = error
        self._parameters = _parameters_json(parameters) if parameters else "{}"

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse({self._outputs!r})"


def _failed(message: str, code: int) -> InferenceResponse:
    return InferenceResponse(error=TritonError(message, code))


class PreferredMemory:
    """Where a BLS response's tensors should live; modelsvc's are always in host memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace context as Triton's python models see it; modelsvc passes none to them."""

    def get_context(self) -> str | None:
        return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _response_from(result: InferResponse) -> InferenceResponse:
    response = InferenceResponse([Tensor._wrap(t.name, t.data) for t in result.outputs])
    if result.parameters:
        response._parameters = json.dumps(result.parameters)
    return response
