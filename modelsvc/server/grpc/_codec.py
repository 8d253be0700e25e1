"""``ModelInferRequest`` and ``ModelInferResponse`` <-> the data plane's protocol types for gRPC (no I/O).

Raw bytes are taken as they come (``np.frombuffer``), typed ``contents`` element by element; every fault names the
tensor. The h2 engine answers ``ModelInfer`` in wire form (``_wire``: outputs written from their arrays).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from ...protocol import (
    InferRequest,
    InferResponse,
    InvalidArgument,
    RequestedOutput,
    Tensor,
    Unsupported,
    deserialize_bytes_tensor,
    element_count,
    numpy_dtype,
    tensor_bytes,
)
from ...protocol._pbparams import CONTENTS_FIELDS, parameters_from_proto, set_proto_parameter
from ._wire import WireAnswer, encode_infer_response_wire

# the numpy dtype the values of each typed ``InferTensorContents`` field arrive in
_ARRIVES_AS: dict[str, np.dtype[Any]] = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
    "bytes_contents": np.dtype(np.object_),
}


def _set_parameters(target: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        try:
            set_proto_parameter(target, key, value)
        except TypeError:
            target[key].string_param = str(value)  # anything else travels as its text


def _from_raw(entry: Any, raw: bytes, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    name, datatype = entry.name, entry.datatype
    dtype = numpy_dtype(datatype)
    count = element_count(shape, dtype, f"input '{name}'")
    if datatype == "BYTES":
        return deserialize_bytes_tensor(raw, count, f"input '{name}'").reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgument(
            f"input '{name}': {len(raw)} bytes of {datatype} data in raw_input_contents, "
            f"but shape {list(shape)} needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_contents(entry: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    name, datatype = entry.name, entry.datatype
    dtype = numpy_dtype(datatype)  # an unknown datatype is named before anything else
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidArgument(f"input '{name}': {datatype} data travels only in raw_input_contents")
    arrives_as = _ARRIVES_AS[field]
    others = [f.name for f, _ in entry.contents.ListFields() if f.name != field]
    if others:
        raise InvalidArgument(f"input '{name}': {datatype} data goes in contents.{field}, not {', '.join(others)}")
    values = getattr(entry.contents, field)
    count = element_count(shape, dtype, f"input '{name}'")
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}': {len(values)} elements of {datatype} data in contents.{field}, "
            f"but shape {list(shape)} needs {count}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    array = np.fromiter(values, dtype=arrives_as, count=count)
    if dtype != arrives_as:  # INT8, INT16, UINT8, UINT16 arrive as 32-bit values
        info = np.iinfo(dtype)
        if count and (array.min() < info.min or array.max() > info.max):
            raise InvalidArgument(f"input '{name}': a value in contents.{field} does not fit {datatype}")
        array = array.astype(dtype)
    return array.reshape(shape)


def decode_infer_request(message: Any) -> InferRequest:
    """A ``ModelInferRequest`` as the data plane's InferRequest; every fault names the tensor.

    Inputs take their bytes from ``raw_input_contents`` (one per input, in input order) or from the typed
    ``contents``; one request uses one way for all its inputs, as in Triton.
    """
    raws = message.raw_input_contents
    entries = message.inputs
    if raws and len(raws) != len(entries):
        raise InvalidArgument(
            f"the request has {len(raws)} raw_input_contents for {len(entries)} inputs: with raw_input_contents, "
            "every input takes one, in input order"
        )
    inputs: list[Tensor] = []
    for index, entry in enumerate(entries):
        shape = tuple(entry.shape)
        params = parameters_from_proto(entry.parameters) if entry.parameters else {}
        if "shared_memory_region" in params:
            raise Unsupported(f"input '{entry.name}': shared memory is not supported by this server")
        if raws:
            if entry.HasField("contents"):
                raise InvalidArgument(
                    f"input '{entry.name}' has typed contents, but the request uses raw_input_contents"
                )
            data = _from_raw(entry, raws[index], shape)
        else:
            data = _from_contents(entry, shape)
        inputs.append(Tensor(entry.name, entry.datatype, shape, data, params))
    outputs = None
    if message.outputs:
        outputs = [
            RequestedOutput(o.name, None, parameters_from_proto(o.parameters) if o.parameters else {})
            for o in message.outputs
        ]
    parameters = parameters_from_proto(message.parameters) if message.parameters else {}
    return InferRequest(inputs=inputs, id=message.id or None, outputs=outputs, parameters=parameters)


def encode_infer_response(response: InferResponse, raw: bool = True) -> Any:
    """The ``ModelInferResponse``: every output's bytes in ``raw_output_contents`` (what tritonclient reads).
    ``raw=False``: without them (``encode_infer_response_wire`` adds them)."""
    message = service_pb2.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id or ""
    )
    outputs = message.outputs
    raws = message.raw_output_contents
    for tensor in response.outputs:
        out = outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if tensor.parameters:
            _set_parameters(out.parameters, tensor.parameters)
        if raw:
            raws.append(tensor_bytes(tensor.datatype, tensor.data))
    if response.parameters:
        _set_parameters(message.parameters, response.parameters)
    return message


def _wire(response: InferResponse) -> WireAnswer:
    return encode_infer_response_wire(response, encode_infer_response(response, raw=False))
