"""HttpServer's HTTP/1.1 handling, in-process with small ASGI apps: the edge cases clients really produce."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from modelsvc.server import HttpServer

WAIT = 10.0


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the path and body length; /big answers 64 KiB."""
    message = await receive()
    body = b"x" * 65536 if scope["path"] == "/big" else f"{scope['path']} {len(message['body'])}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def server():
    srv = HttpServer(echo_app, max_body_size=1000, keep_alive_s=1.0)
    await srv.start("127.0.0.1", 0)
    yield srv
    await srv.shutdown(1.0)


async def connect(srv: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*srv.address)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), WAIT)
    return status, headers, body


def get(path: str, extra: str = "", version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()


async def test_pipelined_requests_behind_connection_close(server):
    reader, writer = await connect(server)
    writer.write(get("/a") + get("/b", "Connection: close\r\n") + get("/c"))
    assert (await read_response(reader))[2] == b"/a 0"
    status, headers, body = await read_response(reader)
    assert (status, body, headers["connection"]) == (200, b"/b 0", "close")
    assert await asyncio.wait_for(reader.read(), WAIT) == b""  # /c is not served after close
    writer.close()


async def test_garbage_after_a_valid_request_answers_the_request_then_400(server):
    reader, writer = await connect(server)
    writer.write(get("/ok") + b"NOT HTTP AT ALL\r\n\r\n")
    assert (await read_response(reader))[2] == b"/ok 0"
    status, _headers, body = await read_response(reader)
    assert status == 400
    assert b"malformed HTTP request" in body
    assert await asyncio.wait_for(reader.read(), WAIT) == b""
    writer.close()


async def test_declared_oversized_body_is_refused_at_once(server):
    reader, writer = await connect(server)
    writer.write(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await read_response(reader)  # no body sent, no 100: the 413 comes anyway
    assert status == 413
    assert headers["connection"] == "close"
    assert b"exceeds the limit of 1000 bytes" in body
    writer.close()


async def test_chunked_body_over_the_limit(server):
    reader, writer = await connect(server)
    writer.write(b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"400\r\n" + b"y" * 1024 + b"\r\n")  # 1024 bytes > 1000
    assert (await read_response(reader))[0] == 413
    writer.close()


async def test_slow_upload_is_not_swept_as_idle(server):
    """keep_alive_s is 1 s; a body trickling in over 2.5 s must not be cut off."""
    reader, writer = await connect(server)
    writer.write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 25\r\n\r\n")
    for _ in range(25):
        writer.write(b"z")
        await writer.drain()
        await asyncio.sleep(0.1)
    assert (await read_response(reader))[2] == b"/slow 25"
    writer.close()


async def test_http_1_0_keep_alive_says_so(server):
    reader, writer = await connect(server)
    writer.write(get("/a", "Connection: keep-alive\r\n", version="1.0"))
    _status, headers, _ = await read_response(reader)
    assert headers["connection"] == "keep-alive"
    writer.write(get("/b", "Connection: keep-alive\r\n", version="1.0"))
    assert (await read_response(reader))[2] == b"/b 0"
    writer.close()


async def test_drain_answers_requests_already_read(server):
    gate = asyncio.Event()

    async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/first":
            await gate.wait()
        await echo_app(scope, receive, send)

    server.app = slow_app
    reader, writer = await connect(server)
    writer.write(get("/first") + get("/second") + get("/third"))
    await asyncio.sleep(0.05)
    draining = asyncio.ensure_future(server.shutdown(WAIT))
    await asyncio.sleep(0.05)
    gate.set()
    bodies = [(await read_response(reader))[2] for _ in range(3)]
    assert bodies == [b"/first 0", b"/second 0", b"/third 0"]
    await draining
    writer.close()


async def test_client_that_stops_reading_is_not_buffered_without_bound(server):
    _reader, writer = await connect(server)
    for _ in range(40):
        writer.write(get("/big") * 50)  # 2000 requests for 64 KiB answers, never read
        await asyncio.sleep(0)
    await asyncio.sleep(0.5)
    conn = next(iter(server.connections))
    assert conn.transport is not None
    assert conn.transport.get_write_buffer_size() < 8 * 65536  # paused: not 128 MB of answers
    writer.close()


async def test_app_cancelling_its_disconnect_wait_does_not_wedge_the_connection(server):
    async def polling_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        with contextlib.suppress(TimeoutError):  # "did the client go away?", with a timeout
            await asyncio.wait_for(receive(), 0.01)
        await echo_app(scope, _once(b""), send)

    server.app = polling_app
    reader, writer = await connect(server)
    writer.write(get("/1") + get("/2") + get("/3"))
    assert [(await read_response(reader))[2] for _ in range(3)] == [b"/1 0", b"/2 0", b"/3 0"]
    writer.close()


def _once(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
