"""What the protocol fuzzing feeds the v2 decoders and what it holds them to
(tests/loadtests/test_fuzz_protocol.py runs a short round in CI, ``python -m loadtests.fuzz`` a long one).

Every target is a hypothesis strategy of inputs and a check. The check decodes; an input either decodes into
something consistent (each tensor's array has the shape it names, as many elements as the shape needs, the
datatype's dtype) or raises the protocol's invalid-input error, InvalidArgument (on gRPC also Unsupported, which
the server answers for shared memory). Anything else that escapes (IndexError, ValueError, MemoryError from a
huge shape, struct.error, RecursionError) is what the fuzzing looks for: the server would answer it with a 500.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from modelsvc.protocol import (
    ALL_DATATYPES,
    InferRequest,
    InvalidArgument,
    Tensor,
    Unsupported,
    decode_infer_request,
    decode_infer_response,
    deserialize_bytes_tensor,
    encode_infer_request,
    grpc_timeout_s,
    numpy_dtype,
    serialize_bytes_tensor,
)
from modelsvc.server.grpc import _codec as _grpc_codec
from modelsvc.server.grpc import _wire as _grpc_wire
from modelsvc.server.grpc._calls import _metadata
from modelsvc.server.http._endpoint import _header_int, infer_target

# -- pieces ----------------------------------------------------------------------------------------------

DATATYPES = st.one_of(
    st.sampled_from(ALL_DATATYPES),
    st.sampled_from(["", "fp32", "FLOAT32", "TYPE_FP32", "STRING", "BYTES ", "INT128"]),
    st.text(max_size=8),
)
"""The protocol's datatypes, near misses and any text."""

DIM = st.one_of(
    st.integers(0, 4),
    st.sampled_from([-1, -(2**63), 2**31, 2**32 + 1, 2**62, 2**63 - 1, 2**64, 10**20]),
    st.integers(-(2**63), 2**63 - 1),
)
SHAPES = st.one_of(st.lists(st.integers(0, 4), max_size=4), st.lists(DIM, max_size=6), st.just([1] * 40))
"""Small shapes mostly, then negative, huge and too many dimensions."""

ODD_TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=["L", "M", "N", "P", "S", "Z", "C"]), max_size=12)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    ODD_TEXT,
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(ODD_TEXT, inner, max_size=3)),
    max_leaves=12,
)
"""Any JSON value: nested lists and objects, numbers past every range, odd unicode."""


def _values(datatype: str, count: int) -> st.SearchStrategy[list[Any]]:
    """``count`` JSON values a ``datatype`` tensor may hold."""
    if datatype == "BOOL":
        return st.lists(st.booleans(), min_size=count, max_size=count)
    if datatype == "BYTES":
        return st.lists(ODD_TEXT, min_size=count, max_size=count)
    if datatype in NUMPY_INTEGERS:
        info = np.iinfo(NUMPY_INTEGERS[datatype])
        return st.lists(st.integers(int(info.min), int(info.max)), min_size=count, max_size=count)
    return st.lists(st.floats(-1e4, 1e4, width=16), min_size=count, max_size=count)


NUMPY_INTEGERS = {
    name: numpy_dtype(name) for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
}


def _nest(flat: list[Any], shape: list[int]) -> Any:
    """``flat`` as nested lists of ``shape`` (what the JSON ``data`` of a tensor usually is)."""
    if len(shape) <= 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _mostly(draw: st.DrawFn, good: st.SearchStrategy[Any], *bad: st.SearchStrategy[Any]) -> Any:
    """What ``good`` draws, else (about one time in four) what one of ``bad`` draws. (Hypothesis draws 0 more often
    than the other values: 0 is the usual case.)"""
    return draw(st.one_of(*bad) if draw(st.integers(0, 3)) == 3 else good)


@st.composite
def _tensor_entry(draw: st.DrawFn, binary_part: list[bytes], names: tuple[str, ...]) -> dict[str, Any]:
    """One JSON input or output: a valid one most often, then with one field or another mutated."""
    datatype = _mostly(draw, st.sampled_from([d for d in ALL_DATATYPES if d != "BF16"]), DATATYPES)
    shape = draw(st.lists(st.integers(0, 3), max_size=3)) if draw(st.integers(0, 3)) else draw(SHAPES)
    entry: dict[str, Any] = {"name": _mostly(draw, st.sampled_from(names), ODD_TEXT), "datatype": datatype}
    entry["shape"] = shape
    count = math.prod(shape) if all(0 <= d <= 8 for d in shape) else 1
    known = datatype in ALL_DATATYPES and datatype != "BF16"
    as_binary = draw(st.booleans())
    if as_binary:
        if known and all(0 <= d <= 8 for d in shape):
            flat = draw(_values(datatype, count))
            array = np.array([v.encode() for v in flat] if datatype == "BYTES" else flat, dtype=numpy_dtype(datatype))
            blob = serialize_bytes_tensor(array) if datatype == "BYTES" else array.tobytes()
        else:
            blob = b""
        blob = _mostly(draw, st.just(blob), st.binary(max_size=40), st.just(blob[:-1]), st.just(blob + b"\0"))
        binary_part.append(blob)
        size: Any = _mostly(
            draw, st.just(len(blob)), st.sampled_from([-1, 2**40, True, "4", None, 1.5]), st.integers(-5, 100)
        )
        entry["parameters"] = {"binary_data_size": size}
    else:
        if known and all(0 <= d <= 8 for d in shape):
            flat = draw(_values(datatype, count))
            data: Any = draw(st.one_of(st.just(_nest(flat, shape)), st.just(flat)))
        else:
            data = []
        entry["data"] = _mostly(
            draw, st.just(data), JSON_VALUES, st.lists(JSON_SCALARS, max_size=6), st.just([data]), st.just([[[[data]]]])
        )
        if draw(st.integers(0, 5)) == 0:
            entry["parameters"] = draw(st.dictionaries(ODD_TEXT, JSON_VALUES, max_size=2))
    if draw(st.integers(0, 9)) == 0:  # a field of the wrong kind or missing
        key = draw(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]))
        if draw(st.booleans()):
            entry.pop(key, None)
        else:
            entry[key] = draw(JSON_VALUES)
    return entry


@dataclass
class Body:
    """An HTTP body and the ``Inference-Header-Content-Length`` sent with it."""

    body: bytes
    header_length: int | None

    def __repr__(self) -> str:
        return f"Body({self.body[:300]!r}{'...' if len(self.body) > 300 else ''}, {self.header_length})"


def _mutate(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with a byte flipped, cut short, or a run of bytes spliced in."""

    @st.composite
    def go(draw: st.DrawFn) -> bytes:
        if not data:
            return draw(st.binary(max_size=20))
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.integers(0, 2))
        if how == 0:
            return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
        if how == 1:
            return data[:at]
        splice = draw(st.sampled_from([b"[", b"]", b"{", b"}", b",", b'"', b"\\u", b"-", b"1e999"]))
        return data[:at] + splice + data[at:]

    return go()


@st.composite
def http_bodies(draw: st.DrawFn, key: str = "inputs", names: tuple[str, ...] = ("INPUT0",)) -> Body:
    """An infer request (``key="inputs"``) or response (``"outputs"``) body: JSON, or JSON with binary data; its
    tensors are named from ``names`` (a model's inputs) or any text."""
    binary_part: list[bytes] = []
    head: dict[str, Any] = {key: draw(st.lists(_tensor_entry(binary_part, names), max_size=3))}
    if key == "outputs":
        head["model_name"] = draw(ODD_TEXT)
        head["model_version"] = draw(st.sampled_from(["1", ""]))
    else:
        if draw(st.booleans()):
            head["outputs"] = draw(
                st.lists(
                    st.fixed_dictionaries(
                        {"name": ODD_TEXT},
                        optional={"parameters": st.dictionaries(st.sampled_from(["binary_data", "x"]), JSON_VALUES)},
                    ),
                    max_size=2,
                )
            )
        if draw(st.booleans()):
            head["parameters"] = draw(st.dictionaries(ODD_TEXT, JSON_VALUES, max_size=3))
    if draw(st.booleans()):
        head["id"] = draw(st.one_of(ODD_TEXT, JSON_VALUES))
    header = msgspec.json.encode(head)
    if draw(st.integers(0, 4)) == 0:
        header = draw(_mutate(header))
    tail = b"".join(binary_part)
    body = header + tail
    with_length: bool = draw(st.booleans())
    if binary_part or with_length:
        header_length: int | None = _mostly(
            draw, st.just(len(header)), st.integers(-3, len(body) + 3), st.sampled_from([-(2**63), 2**64])
        )
    else:
        header_length = None
    return Body(body, header_length)


RAW_BODIES = st.builds(
    Body,
    st.one_of(
        st.binary(max_size=200),
        st.just(b"[" * 100_000),
        st.just(b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":' + b"[" * 100_000),
        st.text(max_size=200).map(str.encode),
    ),
    st.one_of(st.none(), st.integers(-2, 210)),
)
"""Bytes that are JSON by chance at most, and documents nested 100,000 deep."""


# -- checks ----------------------------------------------------------------------------------------------


def consistent(tensor: Tensor) -> None:
    """A decoded tensor is what it says: its array has its shape, as many elements, its datatype's dtype."""
    shape = tuple(tensor.shape)
    assert all(isinstance(d, int) and d >= 0 for d in shape), shape
    assert tensor.data.shape == shape, (tensor.data.shape, shape)
    assert tensor.data.size == math.prod(shape)
    assert tensor.data.dtype == numpy_dtype(tensor.datatype), (tensor.data.dtype, tensor.datatype)
    if tensor.datatype == "BYTES":
        assert all(isinstance(v, bytes) for v in tensor.data.reshape(-1))


DECODED = "decoded"
REFUSED = "refused"


def _named(exc: InvalidArgument | Unsupported) -> None:
    assert exc.message.strip(), "an error without a message"


def check_http_request(case: Body) -> str:
    try:
        request = decode_infer_request(case.body, case.header_length)
    except InvalidArgument as exc:
        _named(exc)
        return REFUSED
    for tensor in request.inputs:
        consistent(tensor)
    return DECODED


def check_http_response(case: Body) -> str:
    try:
        response = decode_infer_response(case.body, case.header_length)
    except InvalidArgument as exc:
        _named(exc)
        return REFUSED
    for tensor in response.outputs:
        consistent(tensor)
    return DECODED


@st.composite
def bytes_tensors(draw: st.DrawFn) -> tuple[bytes, int]:
    """A BYTES tensor's binary data (valid, cut, padded, or any bytes) and the element count asked of it."""
    elements = draw(st.lists(st.binary(max_size=8), max_size=5))
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    good = serialize_bytes_tensor(array)
    buffer = draw(
        st.one_of(
            st.just(good),
            st.binary(max_size=40),
            _mutate(good),
            st.just(struct.pack("<I", 2**32 - 1) + good),
        )
    )
    count = draw(st.one_of(st.just(len(elements)), st.integers(0, 12), st.sampled_from([2**40, 10**12])))
    return buffer, count


def check_bytes_tensor(case: tuple[bytes, int]) -> str:
    buffer, count = case
    try:
        array = deserialize_bytes_tensor(buffer, count, "input 'x'")
    except InvalidArgument:
        return REFUSED
    assert array.shape == (count,)
    assert serialize_bytes_tensor(array) == buffer  # it took every byte, element by element
    return DECODED


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[InferRequest, bool]:
    """A request the client could send (any datatype numpy holds here, small shapes), JSON or binary."""
    inputs = []
    for i in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from([d for d in ALL_DATATYPES if d not in ("BF16", "FP16")]))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        flat = draw(_values(datatype, math.prod(shape)))
        if datatype == "BYTES":
            data = np.empty(len(flat), dtype=np.object_)
            data[:] = [v.encode() for v in flat]
        else:
            data = np.array(flat, dtype=numpy_dtype(datatype))
        inputs.append(Tensor(f"INPUT{i}", datatype, tuple(shape), data.reshape(shape)))
    return InferRequest(inputs=inputs, id=draw(st.one_of(st.none(), ODD_TEXT))), draw(st.booleans())


def check_round_trip(case: tuple[InferRequest, bool]) -> str:
    """What the client encodes, the server decodes to the same tensors."""
    request, binary = case
    body, header_length = encode_infer_request(request, binary)
    decoded = decode_infer_request(body, header_length)
    assert decoded.id == request.id
    assert len(decoded.inputs) == len(request.inputs)
    for sent, got in zip(request.inputs, decoded.inputs, strict=True):
        consistent(got)
        assert (got.name, got.datatype, got.shape) == (sent.name, sent.datatype, sent.shape)
        if sent.datatype in ("FP32", "FP64"):
            np.testing.assert_allclose(got.data, sent.data)
        else:
            assert got.data.tolist() == sent.data.tolist()
    return DECODED


# -- gRPC -------------------------------------------------------------------------------------------------

_CONTENTS = {
    "bool_contents": st.lists(st.booleans(), max_size=5),
    "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
    "int64_contents": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=5),
    "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=5),
    "fp32_contents": st.lists(st.floats(width=32), max_size=5),
    "fp64_contents": st.lists(st.floats(), max_size=5),
    "bytes_contents": st.lists(st.binary(max_size=6), max_size=5),
}
_PARAMETER = st.one_of(
    st.booleans().map(lambda v: ("bool_param", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int64_param", v)),
    st.floats().map(lambda v: ("double_param", v)),
    ODD_TEXT.map(lambda v: ("string_param", v)),
)


def _fill_parameters(target: Any, params: dict[str, tuple[str, Any]]) -> None:
    for key, (kind, value) in params.items():
        setattr(target[key], kind, value)


@st.composite
def grpc_requests(draw: st.DrawFn, model: str = "m", names: tuple[str, ...] = ("INPUT0",)) -> Any:
    """A ModelInferRequest from arbitrary fields: inputs (named from ``names`` or any text) of any datatype and
    shape (int64), typed contents of any kind and length, raw contents of any bytes and number, parameters (shared
    memory among them)."""
    message = service_pb2.ModelInferRequest(model_name=model, id=draw(ODD_TEXT))
    count = draw(st.integers(0, 3))
    raw = draw(st.booleans())
    for _ in range(count):
        shape = draw(st.one_of(st.lists(st.integers(0, 3), max_size=3), SHAPES))
        shape = [max(-(2**63), min(d, 2**63 - 1)) for d in shape]  # an int64 field
        name = draw(st.one_of(st.sampled_from(names), ODD_TEXT))
        entry = message.inputs.add(name=name, datatype=draw(DATATYPES), shape=shape)
        if draw(st.integers(0, 5)) == 0:
            keys = st.one_of(st.just("shared_memory_region"), ODD_TEXT)
            _fill_parameters(entry.parameters, draw(st.dictionaries(keys, _PARAMETER, max_size=2)))
        if not raw or draw(st.integers(0, 5)) == 0:
            for field in draw(st.lists(st.sampled_from(sorted(_CONTENTS)), max_size=2, unique=True)):
                getattr(entry.contents, field).extend(draw(_CONTENTS[field]))
        if raw:
            message.raw_input_contents.append(draw(st.binary(max_size=40)))
    if draw(st.integers(0, 5)) == 0:
        message.raw_input_contents.append(draw(st.binary(max_size=8)))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 2))):
            output = message.outputs.add(name=draw(ODD_TEXT))
            _fill_parameters(output.parameters, draw(st.dictionaries(ODD_TEXT, _PARAMETER, max_size=2)))
    _fill_parameters(message.parameters, draw(st.dictionaries(ODD_TEXT, _PARAMETER, max_size=2)))
    return message


def check_grpc_request(message: Any) -> str:
    try:
        request = _grpc_codec.decode_infer_request(message)
    except (InvalidArgument, Unsupported) as exc:
        _named(exc)
        return REFUSED
    assert len(request.inputs) == len(message.inputs)
    for tensor in request.inputs:
        consistent(tensor)
    return DECODED


@st.composite
def grpc_encodings(draw: st.DrawFn) -> bytes:
    """A ModelInferRequest's encoding, as it is or mutated, or any bytes."""
    message = draw(grpc_requests())
    encoded: bytes = message.SerializeToString()
    return draw(st.one_of(st.just(encoded), _mutate(encoded), st.binary(max_size=100)))


def check_split_raw_inputs(data: bytes) -> str:
    """``split_raw_inputs`` takes the encoding apart or says ValueError (what its caller answers as a bad
    message); and what protobuf parses, split and parsed again is the same message."""
    try:
        rest, raws = _grpc_wire.split_raw_inputs(data)
    except ValueError:
        return REFUSED
    try:
        whole = service_pb2.ModelInferRequest.FromString(data)
    except Exception:  # protobuf refuses what the top-level walk let through (a bad field inside): fine
        return "split, protobuf refused"
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    assert [bytes(r) for r in raws] == list(whole.raw_input_contents)
    parsed.raw_input_contents.extend(bytes(r) for r in raws)
    # compared encoded: a NaN in fp32_contents makes two equal messages unequal
    assert parsed.SerializeToString(deterministic=True) == whole.SerializeToString(deterministic=True)
    return DECODED


# -- headers and paths the servers parse --------------------------------------------------------------------

HEADER_VALUES = st.one_of(
    st.binary(max_size=12),
    st.from_regex(rb"\A[0-9]{0,12}[HMSmun]?\Z"),
    st.sampled_from([b"-1", b"1_000", b" 12 ", b"\xd9\xa3", b"9" * 5000]),
)


def check_header_values(value: bytes) -> str:
    """``grpc-timeout`` (a number of at most 8 digits and a unit, else ignored), the HTTP
    ``Inference-Header-Content-Length`` (an integer, else a 400), and ``-bin`` metadata (base64, else dropped)."""
    timeout = grpc_timeout_s(value)
    assert timeout is None or (isinstance(timeout, float) and timeout >= 0)
    try:
        number = _header_int(value, "inference-header-content-length")
    except InvalidArgument:
        number = -1
    else:
        assert number >= 0
    for key, got in _metadata([(b"x-bin", value), (b"x", value)]):
        assert isinstance(got, bytes if key.endswith("-bin") else str)
    return "a timeout" if timeout is not None else "a length" if number >= 0 else REFUSED


def check_infer_target(path: str) -> str:
    target = infer_target(path)
    if target is None:
        return "not infer"
    model, version = target
    assert model
    assert "/" not in model
    assert version is None or (version and "/" not in version)
    return "infer"


@dataclass(frozen=True)
class Target:
    """One thing fuzzed: its name, what it is fed, and what holds of each input (``check`` raises when it does
    not; otherwise it says what became of the input, e.g. decoded, refused, an HTTP status)."""

    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], str]


TARGETS = [
    Target("http request (structured)", http_bodies(), check_http_request),
    Target("http request (raw bytes)", RAW_BODIES, check_http_request),
    Target("http response", http_bodies("outputs"), check_http_response),
    Target("http round trip", valid_requests(), check_round_trip),
    Target("BYTES tensor", bytes_tensors(), check_bytes_tensor),
    Target("grpc request", grpc_requests(), check_grpc_request),
    Target("grpc split_raw_inputs", grpc_encodings(), check_split_raw_inputs),
    Target("headers", HEADER_VALUES, check_header_values),
    Target(
        "infer path",
        st.one_of(st.text(max_size=40), st.from_regex(r"\A/v2/models/[a-z/]{0,12}/infer\Z")),
        check_infer_target,
    ),
]
