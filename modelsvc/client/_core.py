"""Everything the clients do that is not I/O: typed metadata, tensors from Python values, local checks,
building requests, reading answers, mapping errors, deciding retries. Sync and async clients share it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import msgspec
import numpy as np

from ..protocol import (
    HEADER_CONTENT_LENGTH,
    NUMPY_DTYPES,
    InferRequest,
    InferResponse,
    InvalidArgument,
    RequestedOutput,
    Tensor,
    decode_infer_response,
    encode_infer_request,
    wire_datatype,
)
from ._errors import ClientError, InvalidInput, ProtocolError, Timeout, error_from_http
from ._retry import RetryBudget, RetryPolicy

BINARY_EXTENSION = "binary_tensor_data"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model input or output as metadata describes it; -1 in ``shape`` means any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({self.datatype} {list(self.shape)})"


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int | None = None
    """From the model's config where the server serves one (Triton, modelsvc); None elsewhere."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> ModelMetadata:
        optional = {i["name"] for i in (config or {}).get("input", []) if i.get("optional")}
        try:
            return cls(
                name=data["name"],
                versions=tuple(str(v) for v in data.get("versions", ())),
                platform=data.get("platform", ""),
                inputs=tuple(_spec(t, t["name"] in optional) for t in data.get("inputs", ())),
                outputs=tuple(_spec(t) for t in data.get("outputs", ())),
                max_batch_size=None if config is None else int(config.get("max_batch_size", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"model metadata is malformed: {exc!r}") from None


def _spec(entry: Mapping[str, Any], optional: bool = False) -> TensorSpec:
    return TensorSpec(entry["name"], entry["datatype"], tuple(int(d) for d in entry["shape"]), optional)


@dataclass(slots=True)
class InferResult:
    """The outputs by name as numpy arrays (BYTES as object arrays of ``bytes``)."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray[Any, Any]]
    datatypes: dict[str, str]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_response(cls, response: InferResponse) -> InferResult:
        """From the protocol's transport-neutral response (HTTP decoding, or an in-process engine)."""
        return cls(
            model_name=response.model_name,
            model_version=response.model_version,
            outputs={t.name: t.data for t in response.outputs},
            datatypes={t.name: t.datatype for t in response.outputs},
            id=response.id,
            parameters=response.parameters,
        )

    def __getitem__(self, name: str) -> np.ndarray[Any, Any]:
        return self.outputs[name]

    def as_numpy(self, name: str) -> np.ndarray[Any, Any] | None:
        """tritonclient's spelling: None for an output that is not in the answer."""
        return self.outputs.get(name)


# -- tensors from Python values -------------------------------------------------------------------------


def to_tensor(name: str, value: Any, spec: TensorSpec | None = None, model: str = "") -> Tensor:
    """A wire tensor from a numpy array or plain Python values, checked against ``spec`` when given."""
    datatype = spec.datatype if spec is not None else None
    if datatype == "BYTES" or (datatype is None and _looks_like_text(value)):
        array = _bytes_array(name, value)
        datatype = "BYTES"
    elif datatype == "BF16":
        bf16 = NUMPY_DTYPES.get("BF16")
        if bf16 is None:
            raise InvalidInput(f"input '{name}' is BF16, which needs the ml_dtypes package")
        array = np.asarray(value)
        if array.dtype != bf16:
            if array.dtype.kind not in "fiu":
                raise InvalidInput(f"input '{name}' is BF16: give floats, got {array.dtype}")
            array = array.astype(bf16)
    elif datatype is not None:
        expected = NUMPY_DTYPES.get(datatype)
        if isinstance(value, np.ndarray):
            if expected is not None and value.dtype != expected:
                raise InvalidInput(
                    f"input '{name}' of model '{model}' is {datatype} (numpy {expected}), got a {value.dtype} array"
                )
            array = value
        else:
            array = _convert(name, value, datatype, expected, model)
    else:
        array = np.asarray(value)
        try:
            datatype = wire_datatype(array.dtype)
        except InvalidArgument as exc:
            raise InvalidInput(f"input '{name}': {exc.message}") from None
    if spec is not None:
        _check_shape(name, array.shape, spec, model)
    return Tensor(name, datatype, tuple(array.shape), array)


def _convert(name: str, value: Any, datatype: str, expected: np.dtype[Any] | None, model: str) -> np.ndarray[Any, Any]:
    """Plain Python values to the model's dtype, refusing what would change them (floats or bools into integers,
    strings into numbers, integers out of range), as the server's own JSON decoder does."""
    try:
        array = np.asarray(value)
    except ValueError as exc:
        raise InvalidInput(f"input '{name}' of model '{model}' is {datatype}: {exc}") from None
    if expected is None or array.dtype == expected:
        return array
    what = f"input '{name}' of model '{model}' is {datatype}"
    source = array.dtype.kind
    if source in "OSU":
        raise InvalidInput(f"{what}: got text or mixed values ({array.dtype})")
    if (source == "b") != (expected.kind == "b"):
        raise InvalidInput(f"{what}: got {'true/false' if source == 'b' else 'numbers'}")
    if source == "f" and expected.kind in "iu":
        raise InvalidInput(f"{what}: got fractional numbers for an integer type")
    if source in "iu" and expected.kind in "iu" and array.size:
        info = np.iinfo(expected)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInput(f"{what}: values outside {info.min}..{info.max}")
    return array.astype(expected)


def _looks_like_text(value: Any) -> bool:
    if isinstance(value, str | bytes):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "OSU"
    if isinstance(value, list | tuple):
        first: Any = value
        while isinstance(first, list | tuple) and first:
            first = first[0]
        return isinstance(first, str | bytes)
    return False


def _bytes_array(name: str, value: Any) -> np.ndarray[Any, Any]:
    source = np.asarray(value, dtype=object) if not isinstance(value, np.ndarray) else value
    out = np.empty(source.shape, dtype=object)
    for index, item in np.ndenumerate(source):
        if isinstance(item, bytes | bytearray | np.bytes_):
            out[index] = bytes(item)
        elif isinstance(item, str | np.str_):
            out[index] = str(item).encode("utf-8")
        else:
            raise InvalidInput(f"input '{name}' is BYTES: elements must be str or bytes, got {type(item).__name__}")
    return out


def _check_shape(name: str, shape: tuple[int, ...], spec: TensorSpec, model: str) -> None:
    dims = spec.shape
    if len(shape) != len(dims) or any(d != -1 and d != s for s, d in zip(shape, dims, strict=False)):
        raise InvalidInput(
            f"input '{name}' of model '{model}' has shape {list(shape)}, expected {list(dims)} (-1: any size)"
        )


def check_inputs(meta: ModelMetadata, values: Mapping[str, Any]) -> list[Tensor]:
    """Tensors for ``values``, checked against the model's inputs; every fault names the expectation."""
    specs = {s.name: s for s in meta.inputs}
    unknown = [n for n in values if n not in specs]
    if unknown:
        raise InvalidInput(
            f"model '{meta.name}' has no input {', '.join(repr(u) for u in unknown)}; its inputs: "
            + ", ".join(str(s) for s in meta.inputs)
        )
    missing = [s for s in meta.inputs if s.name not in values and not s.optional]
    if missing:
        raise InvalidInput(f"model '{meta.name}' needs input(s) " + ", ".join(str(s) for s in missing))
    tensors = [to_tensor(name, value, specs[name], meta.name) for name, value in values.items()]
    if meta.max_batch_size:
        sizes = {t.shape[0] for t in tensors if t.shape}
        if len(sizes) > 1:
            raise InvalidInput(f"inputs of model '{meta.name}' disagree on the batch size: {sorted(sizes)}")
        if sizes and max(sizes) > meta.max_batch_size:
            raise InvalidInput(
                f"batch of {max(sizes)} is over model '{meta.name}''s max_batch_size {meta.max_batch_size}"
            )
    return tensors


def check_outputs(meta: ModelMetadata, names: Iterable[str]) -> list[str]:
    known = {s.name for s in meta.outputs}
    wanted = list(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise InvalidInput(
            f"model '{meta.name}' has no output {', '.join(repr(u) for u in unknown)}; its outputs: "
            + ", ".join(str(s) for s in meta.outputs)
        )
    return wanted


# -- requests and answers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepared:
    """An HTTP request ready to send: the I/O half only sends it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None = None


def model_path(name: str, version: str | None) -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return f"{path}/versions/{quote(str(version), safe='')}" if version else path


@dataclass(frozen=True, slots=True)
class InferCall:
    """One try of an inference, as the client hands it to a transport: ``transport.infer(call)``."""

    model: str
    version: str | None
    inputs: Sequence[Tensor]
    outputs: Sequence[str] | None = None
    """The outputs to return by name; None: every output."""
    request_id: str | None = None
    parameters: Mapping[str, Any] | None = None
    """The request's parameters (the client's timeout among them as Triton's ``timeout``)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Trace context to send along: HTTP headers, gRPC metadata."""
    timeout: float | None = None
    """Seconds left for this try; None: no limit."""

    def request(self) -> InferRequest:
        """The protocol's request: what the HTTP codec encodes and an in-process engine runs."""
        return infer_request(self.inputs, self.outputs, self.request_id, self.parameters)


@dataclass(frozen=True, slots=True)
class InferReply:
    """What a transport gives back for an ``InferCall``: the result, and the bytes that went each way (the
    encoded request and answer; the tensors' own bytes in-process), for the call's span."""

    result: InferResult
    bytes_sent: int
    bytes_received: int


def infer_request(
    tensors: Sequence[Tensor],
    outputs: Sequence[str] | None,
    request_id: str | None,
    parameters: Mapping[str, Any] | None,
) -> InferRequest:
    """The protocol's request for a call: what the HTTP codec encodes and an in-process engine runs."""
    return InferRequest(
        inputs=list(tensors),
        id=request_id,
        outputs=[RequestedOutput(n) for n in outputs] if outputs else None,
        parameters=dict(parameters or {}),
    )


def build_infer(
    model: str,
    version: str | None,
    tensors: Sequence[Tensor],
    outputs: Sequence[str] | None,
    *,
    binary: bool,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Prepared:
    request = infer_request(tensors, outputs, request_id, parameters)
    try:
        body, header_length = encode_infer_request(request, binary)
    except InvalidArgument as exc:
        raise InvalidInput(exc.message) from None
    headers = {"content-type": "application/json"}
    if header_length is not None:
        headers = {"content-type": "application/octet-stream", HEADER_CONTENT_LENGTH: str(header_length)}
    return Prepared("POST", model_path(model, version) + "/infer", headers, body)


def parse_infer(status: int, headers: Mapping[str, str], body: bytes) -> InferResult:
    if status != 200:
        raise error_from_body(status, body)
    raw_length = headers.get(HEADER_CONTENT_LENGTH)
    try:
        length = int(raw_length) if raw_length is not None else None
        response = decode_infer_response(body, length)
    except (ValueError, InvalidArgument) as exc:
        raise ProtocolError(f"could not read the inference response: {exc}") from None
    return InferResult.from_response(response)


def parse_json(status: int, body: bytes) -> Any:
    if status != 200:
        raise error_from_body(status, body)
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"the server's answer is not JSON: {exc}") from None


def error_from_body(status: int, body: bytes) -> ClientError:
    """Triton's ``{"error": "..."}``, MLServer's ``{"detail": ...}``, or the text itself."""
    message = ""
    try:
        parsed = msgspec.json.decode(body) if body else None
        if isinstance(parsed, dict):
            detail = parsed.get("error") or parsed.get("detail") or parsed
            if isinstance(detail, list):  # FastAPI validation errors (MLServer): "loc: msg" each
                detail = "; ".join(_validation_item(d) for d in detail)
            message = str(detail)
    except msgspec.DecodeError:
        message = body[:500].decode("utf-8", errors="replace")
    return error_from_http(status, message or f"HTTP {status}")


def _validation_item(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc", ()))
    return f"{where}: {item.get('msg', item)}"


def supports_binary(server_metadata: Mapping[str, Any]) -> bool:
    return BINARY_EXTENSION in server_metadata.get("extensions", ())


# -- retries --------------------------------------------------------------------------------------------


class Attempts:
    """One call's tries: how long the next may take, and whether (and after what pause) to try again."""

    __slots__ = ("attempt", "budget", "deadline", "policy", "timeout")

    def __init__(self, policy: RetryPolicy, budget: RetryBudget | None, timeout: float | None) -> None:
        self.policy = policy
        self.budget = budget
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.attempt = 1
        if budget is not None:
            budget.record_call()

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"no answer within the call's timeout of {self.timeout} s")
        return left

    def after_failure(self, error: ClientError) -> float:
        """The pause before the next try; re-raises ``error`` when there is none to make."""
        if not self.policy.should_retry(error, self.attempt):
            raise error
        delay = self.policy.delay_s(self.attempt)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            raise error
        if self.budget is not None and not self.budget.try_spend():  # spent only on a retry that happens
            raise error
        self.attempt += 1
        return delay


def tensor_count(tensors: Sequence[Tensor]) -> int | None:
    """The batch size a request carries, for tracing (first dimension of the first input)."""
    return tensors[0].shape[0] if tensors and tensors[0].shape else None
