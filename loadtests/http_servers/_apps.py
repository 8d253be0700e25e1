"""The v2 data plane as an ASGI app and as an RSGI app, for the HTTP servers compared in bench_http_servers.

Both answer ``POST .../infer`` with the same InferEndpoint our HttpServer calls on its hot path, and hand every
other request to the same Litestar app (``create_http_app``), so the servers differ only in the HTTP layer.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from litestar import Litestar

from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, InferEndpoint, ModelManager
from modelsvc.server.http._endpoint import create_http_app, infer_target

MAX_BODY = 64 * 1024 * 1024


class Loaded:
    """A repository loaded as ``modelsvc serve`` loads it: the data plane, its Litestar app and its InferEndpoint."""

    def __init__(self, models: ModelManager, dataplane: DataPlane) -> None:
        self.models = models
        self.dataplane = dataplane
        self.app: Litestar = create_http_app(dataplane, max_body_size=MAX_BODY)
        self.endpoint = InferEndpoint(dataplane)
        self.asgi: Any = self.app
        """The same app, called as a plain ASGI callable."""

    @classmethod
    async def load(cls, repo: Path) -> Loaded:
        models = ModelManager(ModelRepository(repo))
        errors = await models.load_all()
        if errors:
            raise RuntimeError("\n".join(errors))
        gc.collect()  # as serve() does
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        dataplane = DataPlane(models)
        dataplane.accepting = True
        return cls(models, dataplane)


def asgi_app(loaded: Loaded) -> Any:
    """ASGI: infer straight to the InferEndpoint (as our HttpServer does), everything else to Litestar."""
    endpoint, litestar = loaded.endpoint, loaded.asgi

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = infer_target(scope["path"])
            if target is not None:
                message = await receive()
                body = message.get("body", b"")
                if message.get("more_body"):
                    parts = [body]
                    while message.get("more_body"):
                        message = await receive()
                        parts.append(message.get("body", b""))
                    body = b"".join(parts)
                reply = await endpoint.handle(target[0], target[1], scope["headers"], body)
                headers = [
                    (b"content-type", reply.content_type),
                    (b"content-length", str(len(reply.body)).encode()),
                    *reply.headers,
                ]
                await send({"type": "http.response.start", "status": reply.status, "headers": headers})
                await send({"type": "http.response.body", "body": reply.body})
                return
        await litestar(scope, receive, send)

    return app


class RsgiApp:
    """RSGI (Granian): infer straight to the InferEndpoint; other routes to Litestar through a buffering bridge."""

    def __init__(self, loaded: Loaded) -> None:
        self.endpoint = loaded.endpoint
        self.litestar = loaded.asgi

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        path = unquote(scope.path)
        if scope.method == "POST":
            target = infer_target(path)
            if target is not None:
                body = await proto()
                headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()]
                reply = await self.endpoint.handle(target[0], target[1], headers, body)
                out = [("content-type", reply.content_type.decode())]
                out += [(k.decode(), v.decode()) for k, v in reply.headers]
                proto.response_bytes(reply.status, out, reply.body)
                return
        await self._asgi(scope, proto, path)

    async def _asgi(self, scope: Any, proto: Any, path: str) -> None:
        body = await proto()
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()]
        asgi_scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": scope.http_version,
            "method": scope.method,
            "scheme": scope.scheme,
            "path": path,
            "raw_path": scope.path.encode(),
            "query_string": scope.query_string.encode(),
            "root_path": "",
            "headers": headers,
            "server": None,
            "client": None,
            "state": {},
        }
        sent = False
        status = 500
        out: list[tuple[str, str]] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Future()  # never: the bridge buffers, nothing waits on a disconnect
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, out
            if message["type"] == "http.response.start":
                status = message["status"]
                out = [
                    (k.decode("latin-1"), v.decode("latin-1"))
                    for k, v in message.get("headers", ())
                    if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")
                ]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.litestar(asgi_scope, receive, send)
        proto.response_bytes(status, out, b"".join(chunks))
