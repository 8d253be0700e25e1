"""Property-based fuzzing of the v2 decoders (issue 17, part 4): HTTP JSON and binary bodies, BYTES tensors, the gRPC
server's ModelInferRequest decoding, its raw-input splitter and its HTTP/2 frame parser, and the headers and paths
the servers parse.

Each property: any input either decodes into consistent tensors or raises the protocol's invalid-input error;
nothing else escapes (the strategies and checks are in loadtests/fuzz/_protocol.py and _h2.py, which ``python -m
loadtests.fuzz`` runs with many more examples). With CI set in the environment the examples are derandomized, so a
CI run is reproducible. The inputs that broke the decoders once are kept as explicit examples.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings

from loadtests.fuzz import _h2 as _fuzz_h2
from loadtests.fuzz import _protocol as fuzz
from loadtests.fuzz._protocol import Body

FUZZ = settings(
    max_examples=int(os.environ.get("MODELSVC_FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_DEEP = (
    b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}]}"
)


def _input(fields: str, tail: bytes = b"") -> Body:
    head = b'{"inputs":[{"name":"a",' + fields.encode("latin-1") + b"}]}"
    return Body(head + tail, len(head) if tail or "binary_data_size" in fields else None)


@FUZZ
@given(fuzz.http_bodies())
# found by this fuzzing, each a 500 before (a MemoryError, a ValueError from numpy) or a value silently wrapped
@example(_input('"shape":[1000000000000],"datatype":"BYTES","parameters":{"binary_data_size":0}'))
@example(_input('"shape":[0,4611686018427387904,4],"datatype":"FP32","parameters":{"binary_data_size":0}'))
@example(_input('"shape":[0,100000000000000000000],"datatype":"FP32","data":[]'))
@example(_input('"shape":[' + ",".join(["1"] * 40) + '],"datatype":"FP32","data":[1]'))
@example(_input('"shape":[1],"datatype":"INT8","data":[1000]'))
@example(_input('"shape":[1],"datatype":"UINT64","data":[-1]'))
@example(_input('"shape":[1],"datatype":"FP16","data":[1e300]'))
@example(_input('"shape":[1],"datatype":"FP32","parameters":{"binary_data_size":true}', b"\0"))
@example(Body(_DEEP, None))
@example(Body(b'{"inputs":[{"name":"\xc0","shape":[0],"datatype":"FP32","data":[]}]}', None))
def test_http_request_decodes_or_is_invalid_argument(case: Body) -> None:
    fuzz.check_http_request(case)


@FUZZ
@given(fuzz.RAW_BODIES)
def test_http_request_from_any_bytes(case: Body) -> None:
    fuzz.check_http_request(case)


@FUZZ
@given(fuzz.http_bodies("outputs"))
@example(Body(b'{"outputs":[],"model_name":"\xf4\x90\x80\x80"}', None))  # a UnicodeDecodeError before
def test_http_response_decodes_or_is_invalid_argument(case: Body) -> None:
    fuzz.check_http_response(case)


@FUZZ
@given(fuzz.valid_requests())
def test_http_request_round_trip(case: object) -> None:
    fuzz.check_round_trip(case)  # type: ignore[arg-type]


@FUZZ
@given(fuzz.bytes_tensors())
@example((b"", 10**12))  # a MemoryError before: the array was made before the data was looked at
def test_bytes_tensor_decodes_or_is_invalid_argument(case: tuple[bytes, int]) -> None:
    fuzz.check_bytes_tensor(case)


def _grpc(datatype: str, shape: list[int], raw: bytes | None) -> object:
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="a", datatype=datatype, shape=shape)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


@FUZZ
@given(fuzz.grpc_requests())
@example(_grpc("BYTES", [10**12], b""))  # each of these was INTERNAL (a MemoryError, a ValueError) before
@example(_grpc("FP32", [0, 2**62, 4], b""))
@example(_grpc("FP32", [0, 2**62, 4], None))
@example(_grpc("FP32", [1] * 40, b"\0\0\0\0"))
def test_grpc_request_decodes_or_is_invalid_argument(message: object) -> None:
    fuzz.check_grpc_request(message)


@FUZZ
@given(fuzz.grpc_encodings())
def test_grpc_split_raw_inputs(data: bytes) -> None:
    fuzz.check_split_raw_inputs(data)


@FUZZ
@given(fuzz.HEADER_VALUES)
def test_header_values(value: bytes) -> None:
    fuzz.check_header_values(value)


@FUZZ
@given(fuzz.TARGETS[-1].strategy)
def test_infer_path(path: str) -> None:
    fuzz.check_infer_target(path)


@FUZZ
@given(_fuzz_h2.frames())
def test_grpc_h2_frames(case: _fuzz_h2.Frames) -> None:
    _fuzz_h2.check_frames(case)


def test_every_target_has_a_test() -> None:
    assert len(fuzz.TARGETS) == 9, "a target added to loadtests/fuzz/_protocol.py needs its test here"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ('"shape":[1000000000000],"datatype":"BYTES","parameters":{"binary_data_size":0}', "holds at most 0"),
        ('"shape":[0,4611686018427387904,4],"datatype":"FP32","parameters":{"binary_data_size":0}', "more elements"),
        ('"shape":[' + ",".join(["1"] * 40) + '],"datatype":"FP32","data":[1]', "40 dimensions, at most 32"),
        ('"shape":[1],"datatype":"INT8","data":[1000]', "does not fit INT8: 1000 is outside [-128, 127]"),
        ('"shape":[1],"datatype":"UINT64","data":[-1]', "does not fit UINT64"),
        ('"shape":[1],"datatype":"FP16","data":[1e300]', "does not fit FP16"),
        ('"shape":[1],"datatype":"FP32","parameters":{"binary_data_size":true}', "non-negative integer"),
        ('"shape":[0],"datatype":"\xc0","data":[]', "not UTF-8"),
    ],
)
def test_what_broke_is_named(fields: str, words: str) -> None:
    from modelsvc.protocol import InvalidArgument, decode_infer_request

    case = _input(fields, b"\0" if "true" in fields else b"")
    with pytest.raises(InvalidArgument, match=None) as caught:
        decode_infer_request(case.body, case.header_length)
    assert words in caught.value.message
