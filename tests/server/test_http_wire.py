"""The HTTP/1.1 server at the byte level: what curl, libcurl (perf_analyzer), httpx and gevent send."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]}
).encode()


def infer_request(body: bytes = BODY, extra: str = "", version: str = "1.1") -> bytes:
    head = (
        f"POST /v2/models/identity/infer HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off the socket (Content-Length framed); leftover bytes stay in ``buffer``."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a full response")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        rest += chunk
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


@pytest.fixture
def conn(server):
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        yield sock


def test_keep_alive_serves_many_requests_on_one_connection(conn):
    buffer = bytearray()
    for _ in range(5):
        conn.sendall(infer_request())
        status, headers, body = read_response(conn, buffer)
        assert status == 200
        assert json.loads(body)["outputs"][0]["data"][3] == 3.0
        assert "connection" not in headers


def test_pipelined_requests_are_answered_in_order(conn):
    bad = json.dumps({"inputs": [{"name": "NOPE", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()
    conn.sendall(infer_request() + infer_request(bad) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    buffer = bytearray()
    assert read_response(conn, buffer)[0] == 200
    status, _, body = read_response(conn, buffer)
    assert status == 400
    assert "NOPE" in json.loads(body)["error"]
    assert read_response(conn, buffer)[0] == 200


def test_expect_100_continue(conn):
    head = infer_request(BODY, "Expect: 100-continue\r\n")
    split = head.index(b"\r\n\r\n") + 4
    conn.sendall(head[:split])
    interim = conn.recv(1024)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    conn.sendall(head[split:])
    assert read_response(conn, bytearray())[0] == 200


def test_chunked_request_body(server):
    def chunks():
        yield BODY[:10]
        yield BODY[10:]

    r = httpx.post(f"{server.base}/v2/models/identity/infer", content=chunks())
    assert r.status_code == 200
    assert r.json()["outputs"][0]["data"][15] == 15.0


def test_connection_close_and_http_1_0(conn, server):
    conn.sendall(infer_request(extra="Connection: close\r\n"))
    status, headers, _ = read_response(conn, bytearray())
    assert status == 200
    assert headers["connection"] == "close"
    assert conn.recv(1) == b""  # the server closed it
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as old:
        old.sendall(infer_request(version="1.0"))
        status, headers, _ = read_response(old, bytearray())
        assert status == 200
        assert old.recv(1) == b""


def test_malformed_http_gets_400_and_the_server_keeps_serving(server):
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as bad:
        bad.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        status, _, body = read_response(bad, bytearray())
        assert status == 400
        assert "malformed HTTP request" in json.loads(body)["error"]
    assert httpx.get(f"{server.base}/v2/health/ready").status_code == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_large_body_with_expect(server, tmp_path):
    """curl sends Expect: 100-continue for large bodies and waits for the interim response."""
    data = np.arange(8 * 16, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [8, 16], "datatype": "FP32", "data": data.tolist()}]})
    path = tmp_path / "body.json"
    path.write_text(body + " " * 200_000)  # big enough for curl to ask before sending
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-S",
            "--max-time",
            "5",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            f"@{path}",
            f"{server.base}/v2/models/identity/infer",
        ],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    assert json.loads(out)["outputs"][0]["shape"] == [8, 16]


def test_head_and_unknown_routes_through_the_asgi_bridge(server):
    r = httpx.get(f"{server.base}/v2/models/identity/config")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert int(r.headers["content-length"]) == len(r.content)
    assert httpx.get(f"{server.base}/nothing/here").status_code == 404
