"""Fuzzing a real ``modelsvc serve``: the protocol fuzzing's bodies and messages sent over HTTP and gRPC, and HTTP
requests mangled below the body (request line, headers, framing).

What every answer must hold: no 500 and no gRPC INTERNAL or UNKNOWN (what the server answers for an exception that
is not the protocol's); an HTTP error is Triton's ``{"error": "..."}``; and the server still answers after each.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2_grpc

from loadtests.fuzz._protocol import JSON_VALUES, Body, Target, grpc_requests, http_bodies
from loadtests.harness._servers import ROOT, modelsvc_server

_BAD_GRPC = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


@dataclass(frozen=True)
class Modelsvc:
    """A running model service: its HTTP base URL, its gRPC host:port, a model and that model's input names."""

    base_url: str
    grpc_url: str
    model: str
    inputs: tuple[str, ...]


@contextmanager
def embedder_modelsvc() -> Iterator[Modelsvc]:
    """``modelsvc serve`` on the embedder's model repository (minilm; built by ``python -m services.build``)."""
    with modelsvc_server(ROOT / "services" / "embedder" / "model_repository", 120) as server:
        yield Modelsvc(server.base_url, server.grpc_url, "minilm", ("input_ids", "attention_mask", "token_type_ids"))


def _error_body(response: httpx.Response) -> str:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    if response.status_code != 200:
        error = response.json().get("error")
        assert isinstance(error, str), response.text[:300]
        assert error.strip(), response.text[:300]
    return str(response.status_code)


def _still_serving(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200, "the server stopped answering"


@st.composite
def _raw_requests(draw: st.DrawFn, path: str, body_strategy: st.SearchStrategy[Body]) -> bytes:
    """An HTTP/1.1 infer request, then maybe mangled: its request line, a header, its framing or any byte."""
    body = draw(body_strategy).body
    method = draw(st.sampled_from([b"POST", b"POST", b"GET", b"PUT", b"POST ", b"P\x00ST", b"CONNECT"]))
    target = draw(st.sampled_from([path.encode(), b"*", b"http://h" + path.encode(), b"/v2/models/%ff/infer"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 x"]))
    headers = [b"Host: fuzz", b"Content-Type: application/json"]
    framing = draw(st.integers(0, 4))
    if framing == 0:
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == 1:  # chunked, maybe with a bad size
        size = draw(st.sampled_from([b"%x" % len(body), b"zz", b"-1", b"ffffffffffffffff"]))
        headers.append(b"Transfer-Encoding: chunked")
        body = size + b"\r\n" + body + b"\r\n0\r\n\r\n"
    elif framing == 2:  # a length that disagrees, or two
        length = draw(st.sampled_from([b"-1", b"1e3", b"99999999999999999999", b"%d, %d" % (len(body), len(body))]))
        headers.append(b"Content-Length: " + length)
    elif framing == 3:
        headers.append(b"Content-Length: %d" % len(body))
        headers.append(b"Inference-Header-Content-Length: " + draw(st.sampled_from([b"x", b"-5", b"1" * 30, b""])))
    else:
        headers.append(b"Content-Length: %d" % len(body))
        name = draw(st.binary(min_size=1, max_size=10))
        headers.append(name + b": " + draw(st.binary(max_size=20)))
    data = b" ".join([method, target, version]) + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
    return data


def _status_line(address: tuple[str, int], data: bytes) -> bytes:
    """The first line the server answers ``data`` with, or b"" if it answers nothing within a moment (a request
    cut short is waited for: not an answer)."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(0.5)
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received.split(b"\r\n", 1)[0]


CONTROL_BODIES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"ready": JSON_VALUES}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.sampled_from([b'{"ready": "\xc0"}', b"[" * 100_000, b'{"ready": ' + b"[" * 5000 + b"]" * 5000 + b"}"]),
)
"""Bodies for the repository index: JSON of any shape, any bytes, bytes that are not UTF-8, deep nesting."""


def modelsvc_targets(server: Modelsvc, client: httpx.Client, channel: grpc.Channel) -> list[Target]:
    """HTTP bodies, raw HTTP requests and gRPC messages against ``server``."""
    path = f"/v2/models/{server.model}/infer"
    bodies = http_bodies("inputs", server.inputs)
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def http_body(case: Body) -> str:
        headers = {"content-type": "application/json"}
        if case.header_length is not None:
            headers["inference-header-content-length"] = str(case.header_length)
        return _error_body(client.post(path, content=case.body, headers=headers))

    def raw_request(data: bytes) -> str:
        line = _status_line((host, int(port)), data)
        _still_serving(client)
        if not line.startswith(b"HTTP/1.1 "):
            return "no answer" if not line else line.decode("latin-1")[:20]
        status = int(line.split()[1])
        assert status < 500, line
        return str(status)

    def index_body(body: bytes) -> str:
        return _error_body(client.post("/v2/repository/index", content=body))

    def grpc_message(message: Any) -> str:
        try:
            stub.ModelInfer(message, timeout=30)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        else:
            return "OK"
        assert code not in _BAD_GRPC, f"{code}: {details}"
        return str(code.name)

    return [
        Target("modelsvc HTTP infer bodies (live)", bodies, http_body),
        Target("modelsvc HTTP raw requests (live)", _raw_requests(path, bodies), raw_request),
        Target("modelsvc gRPC ModelInfer (live)", grpc_requests(server.model, server.inputs), grpc_message),
        Target("modelsvc HTTP repository index bodies (live)", CONTROL_BODIES, index_body),
    ]


def log_errors(path: Path | None) -> list[str]:
    """The lines of a server log that report an internal error or a traceback."""
    if path is None or not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or "internal error" in line or "unexpected error" in line]
