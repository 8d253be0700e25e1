"""The HTTP server of ``modelsvc serve`` under a battery of real clients: tritonclient (geventhttpclient and
aiohttp), requests, urllib3, http.client and httpx, with keep-alive, several connections at once and chunked
uploads (the byte-level battery is test_http_servers_conformance.py)."""

from __future__ import annotations

import asyncio
import http.client
import json

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

WAIT = 10.0
MODEL = "identity"  # the session server's FP32 [-1, 16] identity (tests/conftest.py)


def rows(n: int) -> np.ndarray:
    return np.arange(n * 16, dtype=np.float32).reshape(n, 16)


def _triton_http(url: str) -> np.ndarray:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url, concurrency=4)
    outputs = []
    for n in (1, 8):
        tensor = triton.InferInput("INPUT0", [n, 16], "FP32")
        tensor.set_data_from_numpy(rows(n), binary_data=True)
        pending = [client.async_infer(MODEL, [tensor]) for _ in range(4)]  # 4 connections at once
        outputs += [p.get_result().as_numpy("OUTPUT0") for p in pending]
    client.close()
    return np.concatenate([o[:1] for o in outputs])


def _triton_aio(url: str) -> np.ndarray:
    import tritonclient.http.aio as triton

    async def run() -> np.ndarray:
        client = triton.InferenceServerClient(url)
        tensor = triton.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(rows(1), binary_data=True)
        results = await asyncio.gather(*(client.infer(MODEL, [tensor]) for _ in range(8)))
        await client.close()
        return np.concatenate([r.as_numpy("OUTPUT0") for r in results])

    return asyncio.run(run())


def _raw_body() -> tuple[bytes, dict[str, str]]:
    """A binary-tensor infer body for rows(1), with its Inference-Header-Content-Length header."""
    values = rows(1)
    head = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                        "parameters": {"binary_data_size": values.nbytes}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    return head + values.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def _decode(body: bytes, headers: dict[str, str] | http.client.HTTPMessage) -> np.ndarray:
    json_length = int(headers["inference-header-content-length"] or 0)
    return np.frombuffer(body[json_length:], np.float32).reshape(-1, 16)


def _requests(url: str) -> np.ndarray:
    import requests

    body, headers = _raw_body()
    with requests.Session() as session:  # one kept-alive connection
        assert session.get(f"http://{url}/v2/health/ready", timeout=WAIT).status_code == 200
        out = [session.post(f"http://{url}/v2/models/{MODEL}/infer", data=body, headers=headers, timeout=WAIT)
               for _ in range(3)]  # fmt: skip
    return np.concatenate([_decode(r.content, r.headers) for r in out])  # type: ignore[arg-type]


def _urllib3(url: str) -> np.ndarray:
    import urllib3

    body, headers = _raw_body()
    with urllib3.PoolManager(maxsize=2) as pool:
        r = pool.request("POST", f"http://{url}/v2/models/{MODEL}/infer", body=body, headers=headers)
        chunked = pool.request(
            "POST", f"http://{url}/v2/models/{MODEL}/infer", body=iter([body[:5], body[5:]]), headers=headers,
            chunked=True,
        )  # fmt: skip
    return np.concatenate([_decode(r.data, r.headers), _decode(chunked.data, chunked.headers)])  # type: ignore[arg-type]


def _stdlib(url: str) -> np.ndarray:
    body, headers = _raw_body()
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    conn.request("GET", "/v2/health/live")
    live = conn.getresponse()
    assert (live.status, live.read()) == (200, b"")
    conn.request("POST", f"/v2/models/{MODEL}/infer", body=iter([body]), headers=headers, encode_chunked=True)
    response = conn.getresponse()
    out = _decode(response.read(), response.headers)
    conn.close()
    return out


def _httpx_async(url: str) -> np.ndarray:
    body, headers = _raw_body()

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://{url}", timeout=WAIT) as client:
            return await asyncio.gather(*(client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
                                          for _ in range(16)))  # fmt: skip

    return np.concatenate([_decode(r.content, r.headers) for r in asyncio.run(run())])  # type: ignore[arg-type]


CLIENTS = {
    "tritonclient.http": _triton_http,
    "tritonclient.http.aio": _triton_aio,
    "requests": _requests,
    "urllib3": _urllib3,
    "http.client": _stdlib,
    "httpx-async": _httpx_async,
}


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
def test_real_clients(server, client):
    out = client(server.url)
    assert out.shape[1] == 16
    assert (out == rows(1)).all()
