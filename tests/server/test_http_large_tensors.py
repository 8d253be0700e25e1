"""Megabyte tensors over HTTP: binary outputs written apart from the JSON header (one vectored write, no joined
copy), checked with tritonclient and at the byte level (framing, pipelining, a JSON output beside a binary one)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config, infer_input

pytestmark = pytest.mark.integration

N = 1 << 20  # 4 MiB of FP32 per tensor
ADD_SUB = """name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
"""
PY_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        tensors = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]) for t in tensors]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo: Path = tmp_path_factory.mktemp("large")
    om.write_model(
        repo, "big", om.identity("FP32", ["batch", "n"]), identity_config("big", dims="-1", max_batch_size=4)
    )
    om.write_model(repo, "add_sub", om.add_sub(["batch", "n"]), ADD_SUB)
    (repo / "py_big" / "1").mkdir(parents=True)
    (repo / "py_big" / "1" / "model.py").write_text(PY_IDENTITY)
    (repo / "py_big" / "config.pbtxt").write_text(
        identity_config("py_big", dims="-1", max_batch_size=4).replace(
            'platform: "onnxruntime_onnx"', 'backend: "python"'
        )
    )
    with ModelsvcProcess(repo, "--http-max-input-size", str(64 << 20)) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield c
    c.close()


@pytest.mark.parametrize("model", ["big", "py_big"])
def test_a_4_mib_tensor_comes_back_whole(client: httpclient.InferenceServerClient, model: str) -> None:
    data = np.random.default_rng(0).standard_normal((1, N)).astype(np.float32)
    result = client.infer(model, [infer_input("INPUT0", data)], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (1, N)
    assert np.array_equal(got, data)


def test_two_large_binary_outputs_and_one_json_output(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(N, dtype=np.float32).reshape(1, N)
    b = np.full((1, N), 2.0, np.float32)
    both = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", [infer_input("INPUT0", a), infer_input("INPUT1", b)], outputs=both)
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    small = np.arange(8, dtype=np.float32).reshape(1, 8)
    mixed = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False), httpclient.InferRequestedOutput("OUTPUT1")]
    big = np.ones((1, N // 4), np.float32)
    result = client.infer("add_sub", [infer_input("INPUT0", big), infer_input("INPUT1", big)], outputs=mixed)
    assert np.array_equal(result.as_numpy("OUTPUT0"), big + big)  # JSON
    assert np.array_equal(result.as_numpy("OUTPUT1"), big - big)  # binary, in the tail
    result = client.infer("add_sub", [infer_input("INPUT0", small), infer_input("INPUT1", small)], outputs=both)
    assert np.array_equal(result.as_numpy("OUTPUT0"), small + small)


def _binary_request(data: np.ndarray) -> bytes:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(data.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = head + data.tobytes()
    return (
        f"POST /v2/models/big/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n\r\n"
    ).encode() + body


def _read(sock: socket.socket, buffer: bytearray) -> tuple[dict[str, str], bytes]:
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(1 << 20)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK", lines[0]
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers["content-length"])
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(1 << 20)
        assert chunk, "closed inside a body"
        body += chunk
    buffer[:] = body[length:]
    return headers, bytes(body[:length])


def test_pipelined_large_then_small_answers_are_framed_in_order(server: ModelsvcProcess) -> None:
    large = np.arange(N, dtype=np.float32).reshape(1, N)
    small = np.arange(16, dtype=np.float32).reshape(1, 16)
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_binary_request(large) + _binary_request(small) + _binary_request(large))
        buffer = bytearray()
        for expected in (large, small, large):
            headers, body = _read(sock, buffer)
            json_length = int(headers["inference-header-content-length"])
            output = json.loads(body[:json_length])["outputs"][0]
            assert output["parameters"]["binary_data_size"] == expected.nbytes
            assert len(body) == json_length + expected.nbytes
            assert np.array_equal(np.frombuffer(body[json_length:], np.float32).reshape(expected.shape), expected)
        assert not buffer
