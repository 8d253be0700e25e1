"""``triton_python_backend_utils`` for modelsvc: what a Triton python model imports as ``pb_utils``.

A ``model.py`` written for Triton's python backend starts with ``import triton_python_backend_utils as
pb_utils``. The python backend registers this module under that name in ``sys.modules`` when it loads;
to unit-test a ``model.py`` without a server, call :func:`install` first (or import this module as
``modelsvc.backends.python_utils`` and hand it to the model yourself).

What is here, with Triton's names and behaviour:

- ``Tensor`` (``as_numpy``, ``name``, ``shape``, ``triton_dtype``, ``is_cpu``, ``to_dlpack``,
  ``from_dlpack``, ``__dlpack__``); BYTES tensors are numpy object arrays of ``bytes``.
- ``InferenceRequest``: the requests ``execute`` receives (``inputs``, ``request_id``,
  ``correlation_id``, ``flags``, ``parameters`` as a JSON string, ``requested_output_names``) and the
  requests a model makes of other models (Business Logic Scripting): ``exec()`` and ``async_exec()``.
- ``InferenceResponse``, ``TritonError`` (with its codes), ``TritonModelException``, ``Logger``,
  ``ModelConfig`` (for ``auto_complete_config``), the ``get_*_by_name`` helpers, the type tables and
  ``TRITONSERVER_*`` constants, ``is_model_ready``, ``load_model`` and ``unload_model``.

BLS requests go in-process to the server's data plane (see ``_inprocess``): the target model's checks,
scheduler, batcher and statistics apply, as for a request over HTTP, without a network hop. A BLS
request that fails (unknown model, bad input, full queue) answers with a response whose ``has_error()``
is true, as in Triton; it does not raise.

Not supported, refused with a clear error: decoupled models (``get_response_sender``,
``exec(decoupled=True)``, a decoupled transaction policy) and request rescheduling. Custom metrics
(``MetricFamily``) count in the process but are not exported on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import json
import logging
import struct
import sys
import threading
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelsvc.protocol import (
    CONFIG_TO_WIRE,
    NUMPY_DTYPES,
    AlreadyExists,
    Cancelled,
    ErrorKind,
    InferRequest,
    InferResponse,
    InternalError,
    InvalidArgument,
    ModelsvcError,
    NotFound,
    RequestedOutput,
    Unavailable,
    Unknown,
    Unsupported,
    serialize_bytes_tensor,
    wire_datatype,
)
from modelsvc.protocol import Tensor as WireTensor

from . import _inprocess

MODULE_NAME = "triton_python_backend_utils"
"""The name Triton's python models import this module by."""

logger = logging.getLogger("modelsvc.python_model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1

#: v2 datatype -> Triton's TRITONSERVER_DataType number (what ``Tensor.triton_dtype()`` answers)
_TRITON_DTYPE_NUMBERS: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}

#: model config type name (``TYPE_FP32``) -> numpy scalar type
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    name: NUMPY_DTYPES[wire].type for name, wire in CONFIG_TO_WIRE.items() if wire in NUMPY_DTYPES
}

# request parameters that the protocol itself uses; Triton keeps them out of ``parameters()``
_RESERVED_PARAMETERS = frozenset(
    {"binary_data_output", "priority", "timeout", "sequence_id", "sequence_start", "sequence_end"}
)


def install() -> None:
    """Make this module importable as ``triton_python_backend_utils``, as Triton's python models import it."""
    sys.modules[MODULE_NAME] = sys.modules[__name__]


# --- errors -----------------------------------------------------------------------------------------


class TritonError:
    """An error that fails one request (``InferenceResponse(error=...)``) or that a BLS response carries.

    ``code`` is one of the class constants; INTERNAL when not given.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    __slots__ = ("_code", "_message")

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by this module) to fail what it was doing, with a message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


_ERROR_FOR_CODE: dict[int, type[ModelsvcError]] = {
    TritonError.INVALID_ARG: InvalidArgument,
    TritonError.ALREADY_EXISTS: AlreadyExists,
    TritonError.NOT_FOUND: NotFound,
    TritonError.UNAVAILABLE: Unavailable,
    TritonError.CANCELLED: Cancelled,
    TritonError.UNSUPPORTED: Unsupported,
    TritonError.UNKNOWN: Unknown,
}

_CODE_FOR_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: TritonError.INVALID_ARG,
    ErrorKind.NOT_FOUND: TritonError.NOT_FOUND,
    ErrorKind.UNAVAILABLE: TritonError.UNAVAILABLE,
    ErrorKind.UNSUPPORTED: TritonError.UNSUPPORTED,
    ErrorKind.INTERNAL: TritonError.INTERNAL,
    ErrorKind.ALREADY_EXISTS: TritonError.ALREADY_EXISTS,
    ErrorKind.CANCELLED: TritonError.CANCELLED,
    ErrorKind.UNKNOWN: TritonError.UNKNOWN,
}


def _error_from_triton(error: TritonError) -> ModelsvcError:
    """The server error a response's TritonError fails its request with (INTERNAL and UNKNOWN: InternalError).

    The message goes to the client as the model wrote it, as Triton sends it."""
    return _ERROR_FOR_CODE.get(error.code(), InternalError)(str(error.message()))


def _triton_from_error(exc: ModelsvcError) -> TritonError:
    return TritonError(exc.message, _CODE_FOR_KIND.get(exc.kind, TritonError.INTERNAL))


# --- tensors ----------------------------------------------------------------------------------------


def _bytes_array(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """An object array of ``bytes`` with the shape of ``array``: str elements encoded as UTF-8, other
    objects as the UTF-8 of their ``str``, as Triton serializes them."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    for i, item in enumerate(flat):
        if isinstance(item, bytes):
            out[i] = item
        elif isinstance(item, bytearray | memoryview):
            out[i] = bytes(item)
        else:
            out[i] = str(item).encode("utf-8")
    return out.reshape(array.shape)


def _all_bytes(array: np.ndarray[Any, Any]) -> bool:
    return all(type(item) is bytes for item in array.reshape(-1))


class _DLPackCapsule:
    """Lets numpy read a bare DLPack capsule (numpy takes objects with ``__dlpack__``, not capsules)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: modelsvc tensors live in host memory


class Tensor:
    """A named tensor: an input of a request, an output of a response. ``numpy_array`` is kept, not copied.

    Arrays of numpy ``str`` or ``bytes`` become object arrays of ``bytes`` (BYTES tensors).
    """

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind in ("U", "S"):
            array = _bytes_array(array)
        self._name = name
        self._array = array

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray[Any, Any]) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """Triton's TRITONSERVER_DataType number (FP32 is 11, BYTES 13)."""
        try:
            return _TRITON_DTYPE_NUMBERS[wire_datatype(self._array.dtype)]
        except InvalidArgument:
            return 0

    def is_cpu(self) -> bool:
        """Always True: modelsvc hands python models tensors in host memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data, without a copy (numeric tensors only)."""
        if self._array.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_object: Any) -> Tensor:
        """A tensor over the memory of a DLPack capsule, or of an object with ``__dlpack__`` (host memory only)."""
        source = dlpack_object if hasattr(dlpack_object, "__dlpack__") else _DLPackCapsule(dlpack_object)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise TritonModelException(f"tensor '{name}': cannot read the DLPack data: {exc}") from exc
        if not array.flags.c_contiguous:
            raise TritonModelException(f"tensor '{name}': DLPack tensors must be C-contiguous")
        return Tensor._wrap(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={list(self._array.shape)})"


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry called ``name`` of a model config dict (``json.loads(args["model_config"])``)."""
    return next((entry for entry in model_config.get("input", []) if entry.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry called ``name`` of a model config dict."""
    return next((entry for entry in model_config.get("output", []) if entry.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type for a config type name: ``TYPE_FP32`` -> ``np.float32``, ``TYPE_STRING`` -> ``np.object_``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type for a TRITONSERVER_DataType number, or None."""
    for wire, number in _TRITON_DTYPE_NUMBERS.items():
        if number == data_type and wire in NUMPY_DTYPES:
            return NUMPY_DTYPES[wire].type
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number for a numpy type or dtype, or None."""
    try:
        return _TRITON_DTYPE_NUMBERS[wire_datatype(np.dtype(data_type))]
    except (InvalidArgument, TypeError):
        return None


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """The elements of a BYTES tensor, each as a 4-byte little-endian length and its bytes, as uint8."""
    if input_tensor.size == 0:
        return None
    if input_tensor.dtype.kind not in ("O", "S", "U"):
        return None
    return np.frombuffer(serialize_bytes_tensor(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The elements of serialized BYTES data, as a 1-D object array of ``bytes``."""
    data = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else bytes(encoded_tensor)
    items: list[bytes] = []
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        items.append(data[offset : offset + length])
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


# --- requests and responses ------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class _Caller:
    """The model whose ``execute`` runs on this thread (set by the python backend)."""

    model: str
    version: int
    instances: int


_context = threading.local()


def _set_caller(caller: _Caller | None) -> None:
    _context.caller = caller


def _refuse_server_calls(reason: str) -> None:
    """Refuse BLS and the model API on this thread (finalize runs while the server's loop waits for it)."""
    _context.refusal = reason


class InferenceRequest:
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

    @classmethod
    def _incoming(
        cls,
        inputs: list[Tensor],
        outputs: Sequence[str],
        request: InferRequest | None,
        model_name: str,
        model_version: int,
    ) -> InferenceRequest:
        """A request handed to ``execute`` (no argument checks: the data plane made them)."""
        self = cls.__new__(cls)
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
        return False

    def get_response_sender(self) -> Any:
        raise TritonModelException(
            "get_response_sender() is for decoupled models, which modelsvc's python backend does not support; "
            "return one InferenceResponse per request from execute()"
        )

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("request rescheduling is not supported by modelsvc's python backend")

    # -- Business Logic Scripting --------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on its model and wait for the response; a failure is a response with an error."""
        _refuse_decoupled(decoupled)
        prepared = self._prepare()
        if isinstance(prepared, InferenceResponse):
            return prepared
        binding, request = prepared
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is binding.loop:
            return _failed(
                "exec() cannot wait on the server's own event loop; use 'await request.async_exec()'",
                TritonError.UNSUPPORTED,
            )
        future = asyncio.run_coroutine_threadsafe(
            binding.target.infer(self._model_name, self._version(), request), binding.loop
        )
        try:
            result = future.result(self._timeout_us / 1e6 if self._timeout_us > 0 else None)
        except TimeoutError:
            future.cancel()
            return self._timed_out()
        except Exception as exc:
            return self._failure(exc)
        return _response_from(result)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[InferenceResponse]:
        """Start this request and return an awaitable of its response; call it from ``async def execute``.

        Several requests started this way run at once (``asyncio.gather`` them)."""
        _refuse_decoupled(decoupled)
        here = asyncio.get_running_loop()  # as in Triton: only from a coroutine
        prepared = self._prepare()
        if isinstance(prepared, InferenceResponse):
            ready: asyncio.Future[InferenceResponse] = here.create_future()
            ready.set_result(prepared)
            return ready
        binding, request = prepared
        call = binding.target.infer(self._model_name, self._version(), request)
        if here is binding.loop:
            pending: asyncio.Future[InferResponse] = here.create_task(call)
        else:
            pending = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, binding.loop), loop=here)
        return here.create_task(self._finish(pending))

    async def _finish(self, pending: asyncio.Future[InferResponse]) -> InferenceResponse:
        try:
            if self._timeout_us > 0:
                result = await asyncio.wait_for(pending, self._timeout_us / 1e6)
            else:
                result = await pending
        except TimeoutError:
            return self._timed_out()
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the caller itself is being cancelled
                raise
            return self._failure(exc)
        except Exception as exc:
            return self._failure(exc)
        return _response_from(result)

    def _version(self) -> str | None:
        return None if self._model_version < 0 else str(self._model_version)

    def _prepare(self) -> tuple[_inprocess.Binding, InferRequest] | InferenceResponse:
        refusal: str | None = getattr(_context, "refusal", None)
        if refusal is not None:
            return _failed(f"BLS request to model '{self._model_name}': {refusal}", TritonError.UNSUPPORTED)
        binding = _inprocess.current()
        if binding is None:
            return _failed(
                f"BLS request to model '{self._model_name}': no modelsvc server runs in this process",
                TritonError.UNAVAILABLE,
            )
        caller: _Caller | None = getattr(_context, "caller", None)
        if (
            caller is not None
            and caller.instances == 1
            and caller.model == self._model_name
            and self._model_version in (-1, caller.version)
        ):
            return _failed(
                f"BLS request from model '{caller.model}' to itself would wait forever: its only instance is "
                "busy running the calling request (Triton blocks here too). Give the model more instances "
                "(instance_group count) or call another model",
                TritonError.UNAVAILABLE,
            )
        try:
            return binding, self._wire_request()
        except TritonModelException as exc:
            return _failed(exc.message(), TritonError.INVALID_ARG)

    def _wire_request(self) -> InferRequest:
        tensors = []
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"BLS request to model '{self._model_name}': inputs must be pb_utils.Tensor objects, "
                    f"got {type(tensor).__name__}"
                )
            array = tensor.as_numpy()
            try:
                datatype = wire_datatype(array.dtype)
            except InvalidArgument as exc:
                raise TritonModelException(f"input '{tensor.name()}': {exc.message}") from None
            if datatype == "BYTES" and not _all_bytes(array):
                array = _bytes_array(array)
            tensors.append(WireTensor(tensor.name(), datatype, tuple(array.shape), array))
        parameters = dict(self._parameters)
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        outputs = [RequestedOutput(name) for name in self._requested] or None
        return InferRequest(tensors, id=self._request_id or None, outputs=outputs, parameters=parameters)

    def _timed_out(self) -> InferenceResponse:
        return _failed(
            f"BLS request to model '{self._model_name}' did not finish within its timeout of "
            f"{self._timeout_us} us (a model waiting on itself, or a cycle of models with no free "
            "instance, never finishes)",
            TritonError.UNAVAILABLE,
        )

    def _failure(self, exc: BaseException) -> InferenceResponse:
        if isinstance(exc, ModelsvcError):
            return InferenceResponse(error=_triton_from_error(exc))
        if isinstance(exc, asyncio.CancelledError | concurrent.futures.CancelledError):
            return _failed(f"BLS request to model '{self._model_name}' was cancelled", TritonError.CANCELLED)
        logger.error("BLS request to model '%s' failed", self._model_name, exc_info=exc)
        return _failed(
            f"BLS request to model '{self._model_name}' failed inside the server; see the server log",
            TritonError.INTERNAL,
        )

    def __repr__(self) -> str:
        return f"InferenceRequest(model_name={self._model_name!r}, inputs={self._inputs!r})"


def _refuse_decoupled(decoupled: bool) -> None:
    if decoupled:
        raise TritonModelException("BLS requests to decoupled models are not supported by modelsvc")


def _response_from(result: InferResponse) -> InferenceResponse:
    response = InferenceResponse([Tensor._wrap(t.name, t.data) for t in result.outputs])
    if result.parameters:
        response._parameters = json.dumps(result.parameters)
    return response


def _on_server(action: str, call: Awaitable[Any]) -> Any:
    """Run a data-plane coroutine on the server's loop from a model's thread; TritonModelException on failure."""
    binding = _inprocess.current()
    refusal: str | None = getattr(_context, "refusal", None)
    if binding is None or refusal is not None:
        if asyncio.iscoroutine(call):
            call.close()
        raise TritonModelException(f"{action}: {refusal or 'no modelsvc server runs in this process'}")

    async def run() -> Any:
        return await call

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is binding.loop:
        if asyncio.iscoroutine(call):
            call.close()
        raise TritonModelException(f"{action}: cannot wait on the server's own event loop")
    try:
        return asyncio.run_coroutine_threadsafe(run(), binding.loop).result()
    except ModelsvcError as exc:
        raise TritonModelException(f"{action}: {exc.message}") from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``, or its newest version when empty) is ready on this server."""
    binding = _inprocess.current()
    if binding is None:
        raise TritonModelException("is_model_ready: no modelsvc server runs in this process")
    target = binding.target

    async def ready() -> bool:  # read on the loop, where the model table changes
        return target.model_ready(model_name, model_version or None)

    return bool(_on_server("is_model_ready", ready()))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Ask the server to load ``model_name`` (Triton allows it in explicit model control mode only)."""
    binding = _inprocess.current()
    loader = getattr(binding.target, "load_model", None) if binding is not None else None
    if loader is None:
        raise TritonModelException(f"load_model('{model_name}'): this server cannot load models on request")
    _on_server(f"load_model('{model_name}')", loader(model_name, config or None, files))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Ask the server to unload ``model_name`` (Triton allows it in explicit model control mode only)."""
    binding = _inprocess.current()
    unloader = getattr(binding.target, "unload_model", None) if binding is not None else None
    if unloader is None:
        raise TritonModelException(f"unload_model('{model_name}'): this server cannot unload models on request")
    _on_server(f"unload_model('{model_name}')", unloader(model_name, unload_dependents))


# --- logging and metrics ----------------------------------------------------------------------------


class Logger:
    """Log from a model into the server's log (logger ``modelsvc.python_model``); verbose is DEBUG."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        python_level = {
            Logger.LogLevel.WARNING: logging.WARNING,
            Logger.LogLevel.ERROR: logging.ERROR,
            Logger.LogLevel.VERBOSE: logging.DEBUG,
        }.get(Logger.LogLevel(level), logging.INFO)
        logger.log(python_level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        logger.debug("%s", message)


class Metric:
    """One labelled series of a MetricFamily. Counts in the process; not exported on /metrics."""

    def __init__(self, kind: int, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        self.labels = labels
        self._kind = kind
        self._value = 0.0
        self._lock = threading.Lock()

    def increment(self, value: float) -> None:
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot go down")
        with self._lock:
            self._value += value

    def set(self, value: float) -> None:
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("only a gauge can be set")
        with self._lock:
            self._value = value

    def observe(self, value: float) -> None:
        with self._lock:
            self._value += value

    def value(self) -> float:
        return self._value


class MetricFamily:
    """Triton's custom metrics API. The values live in the process; modelsvc does not export them yet."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:
        return Metric(self.kind, dict(labels or {}), buckets)


# --- auto-complete ----------------------------------------------------------------------------------

_INPUT_KEYS = frozenset({"name", "data_type", "dims", "optional"})
_OUTPUT_KEYS = frozenset({"name", "data_type", "dims"})


class ModelConfig:
    """The model configuration that ``auto_complete_config`` receives, changes and returns.

    ``as_dict()`` gives the configuration as Triton's JSON (a dict); the setters change it, and the
    returned object becomes the model's configuration.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; ValueError when the configuration already says more."""
        if self._config["max_batch_size"] > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {self._config['max_batch_size']}, but "
                f"auto_complete_config of model '{self._config['name']}' sets {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Add an empty ``dynamic_batching`` unless there is one; ValueError with another scheduler."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"configuration of model '{self._config['name']}' sets {other}; auto_complete_config "
                    "cannot add dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # Triton's parameter name
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if transaction_policy_dict.get("decoupled"):
            raise ValueError(
                f"auto_complete_config of model '{self._config['name']}' asks for a decoupled transaction "
                "policy; modelsvc's python backend does not support decoupled models"
            )
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise ValueError(f"model_transaction_policy has no field(s) {sorted(unknown)}")
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def _add(self, kind: str, entry: dict[str, Any], allowed: frozenset[str]) -> None:
        model = self._config["name"]
        name = entry.get("name")
        if name is None:
            raise ValueError(f"{kind} in auto_complete_config of model '{model}' has no 'name'")
        extra = set(entry) - allowed
        if extra:
            raise ValueError(
                f"{kind} '{name}' in auto_complete_config of model '{model}' has unknown properties "
                f"{sorted(extra)} (allowed: {sorted(allowed)})"
            )
        for key in ("data_type", "dims"):
            if key not in entry:
                raise ValueError(f"{kind} '{name}' in auto_complete_config of model '{model}' has no '{key}'")
        for existing in self._config[kind]:
            if existing.get("name") != name:
                continue
            listed = existing.get("data_type", "TYPE_INVALID")
            if listed != "TYPE_INVALID" and listed != entry["data_type"]:
                raise ValueError(
                    f"model '{model}': the configuration says {listed} for {kind} '{name}', "
                    f"auto_complete_config says {entry['data_type']}"
                )
            dims = existing.get("dims")
            if dims and list(dims) != list(entry["dims"]):
                raise ValueError(
                    f"model '{model}': the configuration says dims {list(dims)} for {kind} '{name}', "
                    f"auto_complete_config says {list(entry['dims'])}"
                )
            existing.update(entry)
            return
        self._config[kind].append(dict(entry))


__all__ = [
    "MODULE_NAME",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "install",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
