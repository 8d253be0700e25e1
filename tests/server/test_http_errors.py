"""Bad input gets a precise 4xx naming what is wrong, and the next valid request still succeeds."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

GOOD = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base, timeout=10) as c:
        yield c


def post_infer(http, body, model="identity", headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(f"/v2/models/{model}/infer", content=content, headers=headers or {})


def binary_body(header: dict, blob: bytes) -> tuple[bytes, dict]:
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def assert_error(response, status, *fragments):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, message


CASES = {
    "not json": (b"{nope", 400, ["not valid JSON"]),
    "inputs missing": ({"outputs": []}, 400, ["inputs"]),
    "shape not a list": (
        {"inputs": [{"name": "INPUT0", "shape": "1,16", "datatype": "FP32", "data": [1]}]},
        400,
        ["shape"],
    ),
    "unknown input": (
        {"inputs": [{"name": "INPUTX", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]},
        400,
        ["INPUTX", "INPUT0"],
    ),
    "wrong datatype": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}]},
        400,
        ["INPUT0", "INT32", "FP32"],
    ),
    "unknown datatype": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP128", "data": list(range(16))}]},
        400,
        ["FP128"],
    ),
    "wrong shape": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 17], "datatype": "FP32", "data": list(range(17))}]},
        400,
        ["INPUT0", "[-1, 16]", "[1, 17]"],
    ),
    "data count disagrees with shape": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1, 2]}]},
        400,
        ["INPUT0", "2 elements", "16"],
    ),
    "strings for FP32": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ["a"] * 16}]},
        400,
        ["INPUT0", "numbers"],
    ),
    "batch over max_batch_size": (
        {"inputs": [{"name": "INPUT0", "shape": [9, 16], "datatype": "FP32", "data": [0] * 144}]},
        400,
        ["batch-size", "8"],
    ),
    "negative dim": (
        {"inputs": [{"name": "INPUT0", "shape": [-1, 16], "datatype": "FP32", "data": [0] * 16}]},
        400,
        ["INPUT0", "negative"],
    ),
    "no data": ({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"}]}, 400, ["INPUT0"]),
    "unknown output": ({**GOOD, "outputs": [{"name": "OUTPUT9"}]}, 400, ["OUTPUT9"]),
    "bad priority": ({**GOOD, "parameters": {"priority": "high"}}, 400, ["priority"]),
}


@pytest.mark.parametrize("case", CASES)
def test_malformed_json_request(http, case):
    body, status, fragments = CASES[case]
    assert_error(post_infer(http, body), status, *fragments)
    assert post_infer(http, GOOD).status_code == 200


def test_missing_input_names_it(http):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16}]}
    assert_error(post_infer(http, body, model="add_sub"), 400, "missing required input(s) ['INPUT1']")


def test_binary_size_disagrees_with_shape(http):
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 60}}]
    }
    body, headers = binary_body(header, b"\0" * 60)
    assert_error(post_infer(http, body, headers=headers), 400, "INPUT0", "60 bytes", "64")
    assert post_infer(http, GOOD).status_code == 200


def test_binary_size_runs_past_the_body(http):
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}]
    }
    body, headers = binary_body(header, b"\0" * 10)
    assert_error(post_infer(http, body, headers=headers), 400, "INPUT0", "past the end")


def test_leftover_binary_bytes(http):
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}]
    }
    body, headers = binary_body(header, b"\0" * 70)
    assert_error(post_infer(http, body, headers=headers), 400, "6 bytes")


def test_header_length_outside_the_body(http):
    body = json.dumps(GOOD).encode()
    assert_error(
        post_infer(http, body, headers={"Inference-Header-Content-Length": "99999"}),
        400,
        "Inference-Header-Content-Length",
    )
    assert_error(
        post_infer(http, body, headers={"Inference-Header-Content-Length": "x"}),
        400,
        "inference-header-content-length",
    )


def test_truncated_bytes_tensor(http):
    blob = struct.pack("<I", 5) + b"abc"
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 4],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(blob)},
            }
        ]
    }
    body, headers = binary_body(header, blob)
    assert_error(post_infer(http, body, model="identity_bytes", headers=headers), 400, "INPUT0", "BYTES")


def test_unknown_model_and_version_are_404(http):
    assert_error(post_infer(http, GOOD, model="nope"), 404, "nope")
    r = http.post("/v2/models/identity/versions/9/infer", content=json.dumps(GOOD))
    assert_error(r, 404, "identity", "9")
    assert_error(http.get("/v2/models/nope"), 404, "nope")
    assert_error(http.get("/v2/models/nope/config"), 404, "nope")
    assert_error(http.get("/v2/models/nope/stats"), 404, "nope")


def test_body_over_the_limit_is_413(http):
    big = np.zeros((8, 40_000), np.float32).tobytes()  # over the 1 MiB limit the fixture sets
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [8, 40_000],
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(big)},
            }
        ]
    }
    body, headers = binary_body(header, big)
    assert_error(post_infer(http, body, headers=headers), 413, "exceeds the limit")
    assert post_infer(http, GOOD).status_code == 200


def test_unknown_route_and_method(http):
    assert http.get("/v2/nothing").status_code == 404
    assert http.put("/v2/models/identity/infer").status_code == 405
    assert "error" in http.get("/v2/nothing").json()


def test_bad_repository_index_body(http):
    assert_error(http.post("/v2/repository/index", content=b"[1"), 400, "JSON")
    assert http.post("/v2/repository/index", content=b'{"ready": true}').status_code == 200


@pytest.mark.parametrize("depth", [70, 2_000, 100_000])
def test_deeply_nested_data_is_a_400_and_the_server_keeps_serving(http, depth):
    data = "[" * depth + "1" + "]" * depth
    body = f'{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":{data}}}]}}'.encode()
    assert_error(post_infer(http, body), 400, "nested")
    if depth > 1_000:  # past the JSON decoder's own depth guard: the control routes' bodies too
        index = b'{"ready": ' + b"[" * depth + b"]" * depth + b"}"
        assert_error(http.post("/v2/repository/index", content=index), 400, "nested too deeply")
    assert post_infer(http, GOOD).status_code == 200
