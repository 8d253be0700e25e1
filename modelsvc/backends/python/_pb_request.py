"""pb_utils requests: ``InferenceRequest`` as ``execute`` receives it and as a model builds one for BLS (whose
``exec``/``async_exec`` come from ``_pb_bls.BLSRequest``), and ``get_input_tensor_by_name``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from modelsvc.protocol import InferRequest

from ._pb_bls import BLSRequest
from ._pb_errors import TritonModelException
from ._pb_response import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceTrace,
    PreferredMemory,
    _parameters_json,
)
from ._pb_tensor import Tensor

# request parameters that the protocol itself uses; Triton keeps them out of ``parameters()``
_RESERVED_PARAMETERS = frozenset(
    {"binary_data_output", "priority", "timeout", "sequence_id", "sequence_start", "sequence_end"}
)


class InferenceRequest(BLSRequest):
    """A request: one of those ``execute`` receives, or one a model makes of another model (BLS).

    A BLS request needs ``model_name``, ``requested_output_names`` and ``inputs`` (a list of Tensor);
    ``model_version`` -1 means the newest loaded version; ``timeout`` (microseconds, 0 for none) bounds
    how long ``exec`` waits. The keyword order is Triton's.
    """

    __slots__ = (
        "_correlation_id",
        "_flags",
        "_inputs",
        "_model_name",
        "_model_version",
        "_parameters",
        "_request_id",
        "_requested",
        "_sender",
        "_timeout_us",
    )

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        model_name: str | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if model_name is None or requested_output_names is None or inputs is None:
            raise TypeError("InferenceRequest needs model_name, requested_output_names and inputs")
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        _parameters_json(parameters)  # refuse what Triton refuses, at once
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(dict.fromkeys(requested_output_names))
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout_us = timeout
        self._parameters: dict[str, Any] = dict(parameters) if parameters else {}
        self._sender: Any = None

    @classmethod
    def _incoming(
        cls,
        inputs: list[Tensor],
        outputs: Sequence[str],
        request: InferRequest | None,
        model_name: str,
        model_version: int,
        sender: Any = None,
    ) -> InferenceRequest:
        """A request handed to ``execute`` (no argument checks: the data plane made them); ``sender``: its
        ``InferenceResponseSender`` when the model is decoupled."""
        self = cls.__new__(cls)
        self._sender = sender
        params = request.parameters if request is not None else {}
        self._request_id = (request.id or "") if request is not None else ""
        self._correlation_id = params.get("sequence_id", 0) if params else 0
        flags = 0
        if params:
            if params.get("sequence_start"):
                flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if params.get("sequence_end"):
                flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        self._flags = flags
        self._inputs = inputs
        self._requested = list(outputs)
        self._model_name = model_name
        self._model_version = model_version
        timeout = params.get("timeout", 0) if params else 0
        self._timeout_us = timeout if isinstance(timeout, int) else 0
        self._parameters = {k: v for k, v in params.items() if k not in _RESERVED_PARAMETERS} if params else {}
        return self

    # -- what a model reads ------------------------------------------------------------------------
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none)."""
        return self._timeout_us

    def parameters(self) -> str:
        """The request's parameters as a JSON string (``json.loads`` it), as Triton gives them."""
        return json.dumps(self._parameters) if self._parameters else "{}"

    def requested_output_names(self) -> list[str]:
        return self._requested

    def trace(self) -> InferenceTrace:
        return InferenceTrace()

    def is_cancelled(self) -> bool:
        """True once the request's client went away (a decoupled model's stream was cancelled)."""
        return self._sender is not None and bool(self._sender.is_cancelled())

    def get_response_sender(self) -> Any:
        """The request's ``InferenceResponseSender`` (decoupled models; the same object at every call)."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models (model_transaction_policy { decoupled: true }); "
                "a model that is not decoupled returns one InferenceResponse per request from execute()"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("request rescheduling is not supported by modelsvc's python backend")

    def __repr__(self) -> str:
        return f"InferenceRequest(model_name={self._model_name!r}, inputs={self._inputs!r})"


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None
