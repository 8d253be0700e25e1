"""The HTTP/REST v2 body format, with the binary tensor data extension.

A request body is a JSON header, optionally followed by raw tensor bytes; the
``Inference-Header-Content-Length`` header gives the JSON part's length. Inputs whose
``parameters.binary_data_size`` is set take their bytes, in order, from the part after
the JSON. Outputs go back the same way when the client asks for binary data.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from ._datatypes import (
    deserialize_bytes_tensor,
    element_count,
    numpy_dtype,
    tensor_bytes,
    to_bytes_elements,
)
from ._errors import InvalidArgument
from ._types import InferRequest, InferResponse, RequestedOutput, Tensor

HEADER_CONTENT_LENGTH = "inference-header-content-length"


class _JsonInput(msgspec.Struct, kw_only=True):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = msgspec.UNSET


class _JsonOutput(msgspec.Struct, kw_only=True):
    name: str
    parameters: dict[str, Any] | None = None


class _JsonRequest(msgspec.Struct, kw_only=True):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[_JsonInput]
    outputs: list[_JsonOutput] | None = None


class _JsonResponse(msgspec.Struct, kw_only=True):
    model_name: str = ""
    model_version: str = ""
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[_JsonInput] = msgspec.field(default_factory=list)


_request_decoder = msgspec.json.Decoder(_JsonRequest)
_response_decoder = msgspec.json.Decoder(_JsonResponse)
_encoder = msgspec.json.Encoder()


def _split_body(body: bytes, header_length: int | None) -> tuple[bytes | memoryview, memoryview]:
    """The JSON header and the binary part after it (``Inference-Header-Content-Length`` bytes of JSON)."""
    if header_length is None:
        return body, memoryview(b"")
    if header_length < 0 or header_length > len(body):
        raise InvalidArgument(
            f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes"
        )
    view = memoryview(body)
    return view[:header_length], view[header_length:]


def decode_infer_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Parse a v2 infer request body; every fault is an InvalidArgument naming what is wrong."""
    header, binary = _split_body(body, header_length)
    try:
        raw = _request_decoder.decode(header)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"malformed inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"inference request is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's depth guard: arrays or objects nested thousands deep
        raise InvalidArgument("inference request JSON is nested too deeply for the JSON decoder") from None
    except UnicodeDecodeError as exc:  # msgspec's check of a string's bytes
        raise InvalidArgument(f"inference request JSON has a string that is not UTF-8: {exc}") from None

    offset = 0
    inputs: list[Tensor] = []
    for item in raw.inputs:
        tensor, offset = _decode_tensor(item, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidArgument(f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    outputs = None
    if raw.outputs is not None:
        outputs = []
        for out in raw.outputs:
            params = out.parameters or {}
            binary_flag = params.pop("binary_data", None)
            outputs.append(RequestedOutput(out.name, None if binary_flag is None else bool(binary_flag), params))
    return InferRequest(inputs=inputs, id=raw.id, outputs=outputs, parameters=raw.parameters or {})


def _decode_tensor(item: _JsonInput, binary: memoryview, offset: int, role: str = "input") -> tuple[Tensor, int]:
    name = item.name
    shape = tuple(item.shape)
    dtype = numpy_dtype(item.datatype)
    count = element_count(shape, dtype, f"{role} '{name}'")
    params = item.parameters or {}
    size = params.pop("binary_data_size", None)
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidArgument(f"{role} '{name}': binary_data_size must be a non-negative integer")
        if item.data is not msgspec.UNSET:
            raise InvalidArgument(f"{role} '{name}' has both binary_data_size and JSON data")
        if offset + size > len(binary):
            raise InvalidArgument(
                f"{role} '{name}': binary_data_size {size} runs past the end of the body "
                f"({len(binary) - offset} bytes left)"
            )
        chunk = binary[offset : offset + size]
        offset += size
        if item.datatype == "BYTES":
            array = deserialize_bytes_tensor(chunk, count, f"{role} '{name}'").reshape(shape)
        else:
            expected = count * dtype.itemsize
            if size != expected:
                raise InvalidArgument(
                    f"{role} '{name}': {size} bytes of {item.datatype} data, but shape {list(shape)} needs {expected}"
                )
            array = np.frombuffer(chunk, dtype=dtype).reshape(shape)
    else:
        if item.data is msgspec.UNSET:
            raise InvalidArgument(f"{role} '{name}' has neither JSON data nor binary_data_size")
        array = _json_array(name, item.datatype, dtype, item.data, shape, count, role)
    return Tensor(name, item.datatype, shape, array, params), offset


MAX_JSON_DEPTH = 64
"""The deepest nesting of a tensor's ``data`` taken (a tensor has at most 64 dimensions in Triton's config); the JSON
decoder itself refuses documents nested thousands deep."""


def _flatten(value: Any, out: list[Any]) -> None:
    """``value``'s leaves in order, nested lists walked without recursion; deeper than MAX_JSON_DEPTH is refused."""
    if not isinstance(value, list):
        out.append(value)
        return
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= MAX_JSON_DEPTH:
                    raise InvalidArgument(f"tensor data is nested more than {MAX_JSON_DEPTH} levels deep")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()


def _json_array(
    name: str, datatype: str, dtype: np.dtype[Any], data: Any, shape: tuple[int, ...], count: int, role: str = "input"
) -> np.ndarray[Any, Any]:
    flat: list[Any] = []
    _flatten(data, flat)
    if len(flat) != count:
        raise InvalidArgument(f"{role} '{name}': {len(flat)} elements of data, but shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = to_bytes_elements(flat, f"{role} '{name}'")
        return array.reshape(shape)
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise InvalidArgument(f"{role} '{name}': BOOL data must be true or false")
    elif any(isinstance(v, bool | str) or v is None for v in flat):
        raise InvalidArgument(f"{role} '{name}': {datatype} data must be numbers")
    try:
        # a float that overflows FP16 or FP32 is refused, not made infinite
        with np.errstate(over="raise"):
            array = _integers(flat, dtype) if dtype.kind in "iu" else np.array(flat, dtype=dtype)
        return array.reshape(shape)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise InvalidArgument(f"{role} '{name}': data does not fit {datatype}: {exc}") from None


def _integers(flat: list[Any], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """JSON numbers as an integer array, each checked against the datatype's range: numpy would wrap 1000 to -24
    as INT8 and -1 to 2**64-1 as UINT64. (A number outside INT64 raises OverflowError while it is converted.)"""
    if dtype == np.uint64:
        if flat and min(flat) < 0:
            raise OverflowError("a negative value")
        return np.array(flat, dtype=dtype)
    wide = np.array(flat, dtype=np.int64)
    if dtype == np.int64:
        return wide
    if wide.size:
        info = np.iinfo(dtype)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            raise OverflowError(f"{low if low < info.min else high} is outside [{info.min}, {info.max}]")
    return wide.astype(dtype)


def encode_infer_response(response: InferResponse, binary: list[bool]) -> tuple[bytes, int | None]:
    """Encode a response; ``binary[i]`` says whether output i goes as raw bytes.

    Returns the body and, when any output is binary, the JSON header's length (for the
    ``Inference-Header-Content-Length`` response header).
    """
    parts, json_length = encode_infer_response_parts(response, binary)
    return (parts[0] if len(parts) == 1 else b"".join(parts)), json_length


def encode_infer_response_parts(response: InferResponse, binary: list[bool]) -> tuple[list[bytes], int | None]:
    """``encode_infer_response`` with the body left in pieces (the JSON header, then each binary output's
    bytes), for a server that writes them out with one vectored write instead of joining them first."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor, as_binary in zip(response.outputs, binary, strict=True):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        params = dict(tensor.parameters)
        if as_binary:
            blob = tensor_bytes(tensor.datatype, tensor.data)
            params["binary_data_size"] = len(blob)
            blobs.append(blob)
        else:
            entry["data"] = _json_data(tensor)
        if params:
            entry["parameters"] = params
        outputs.append(entry)
    head: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id is not None:
        head["id"] = response.id
    if response.parameters:
        head["parameters"] = response.parameters
    head["outputs"] = outputs
    header = _encoder.encode(head)
    if not blobs:
        return [header], None
    return [header, *blobs], len(header)


def _json_data(tensor: Tensor) -> list[Any]:
    flat = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", errors="backslashreplace") if isinstance(v, bytes) else str(v) for v in flat]
    if tensor.datatype == "BF16":
        return flat.astype(np.float32).tolist()  # type: ignore[no-any-return]
    return flat.tolist()  # type: ignore[no-any-return]


def encode_error(message: str) -> bytes:
    """Triton's error body: ``{"error": "..."}``."""
    return _encoder.encode({"error": message})


def encode_json(value: Any) -> bytes:
    return _encoder.encode(value)


# -- the client's side: requests out, responses in -------------------------------------------------------


def encode_infer_request(request: InferRequest, binary: bool) -> tuple[bytes, int | None]:
    """Encode a request; with ``binary``, tensors travel as raw bytes after the JSON header.

    Returns the body and, when binary, the JSON header's length (``Inference-Header-Content-Length``).
    Requested outputs keep their own ``binary`` choice; ``None`` there means "as the inputs travel".
    """
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in request.inputs:
        entry: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        params = dict(tensor.parameters)
        if binary:
            blob = tensor_bytes(tensor.datatype, tensor.data)
            params["binary_data_size"] = len(blob)
            blobs.append(blob)
        else:
            entry["data"] = _json_request_data(tensor)
        if params:
            entry["parameters"] = params
        inputs.append(entry)
    head: dict[str, Any] = {}
    if request.id is not None:
        head["id"] = request.id
    params = dict(request.parameters)
    if request.outputs:
        head["outputs"] = [
            {
                "name": out.name,
                "parameters": {**out.parameters, "binary_data": binary if out.binary is None else out.binary},
            }
            for out in request.outputs
        ]
    elif binary:
        params["binary_data_output"] = True
    if params:
        head["parameters"] = params
    head["inputs"] = inputs
    header = _encoder.encode(head)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def _json_request_data(tensor: Tensor) -> list[Any]:
    if tensor.datatype == "BYTES":
        out = []
        for v in tensor.data.reshape(-1):
            if isinstance(v, bytes | bytearray):
                try:
                    out.append(bytes(v).decode("utf-8"))
                except UnicodeDecodeError:
                    raise InvalidArgument(
                        f"input '{tensor.name}': BYTES element is not UTF-8, which JSON cannot carry; "
                        "send it with the binary tensor extension"
                    ) from None
            else:
                out.append(str(v))
        return out
    return _json_data(tensor)


def decode_infer_response(body: bytes, header_length: int | None = None) -> InferResponse:
    """Parse a v2 infer response body (JSON, or JSON plus binary outputs)."""
    header, binary = _split_body(body, header_length)
    try:
        raw = _response_decoder.decode(header)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidArgument(f"malformed inference response: {exc}") from None
    except RecursionError:
        raise InvalidArgument("inference response JSON is nested too deeply for the JSON decoder") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"inference response JSON has a string that is not UTF-8: {exc}") from None
    offset = 0
    outputs: list[Tensor] = []
    for item in raw.outputs:
        tensor, offset = _decode_tensor(item, binary, offset, role="output")
        outputs.append(tensor)
    return InferResponse(
        model_name=raw.model_name,
        model_version=raw.model_version,
        outputs=outputs,
        id=raw.id,
        parameters=raw.parameters or {},
    )
