"""The HTTP server's bridge to an ASGI app (the Litestar app: every route but ``POST .../infer``).

One request in, one buffered answer out, which suits the control routes: small, never streamed. Beyond what the
app does itself, the bridge makes the answers what HTTP/1.1 asks of an origin server: HEAD on a GET route is
answered as GET (the server then sends the head alone), and a 405 carries ``Allow``, the methods of the route the
path matches (read from the app's route table when it has one).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from ...protocol import encode_error

logger = logging.getLogger("modelsvc.http")

#: an ASGI application (the Litestar app), called as app(scope, receive, send)
ASGIApp = Callable[..., Awaitable[None]]

#: status, body, content type, headers, and more of the body to write after ``body`` (large binary outputs)
Answer = tuple[int, bytes, bytes | None, tuple[tuple[bytes, bytes], ...], tuple[bytes, ...]]

_JSON = b"application/json"
_SKIPPED = {b"content-length", b"transfer-encoding", b"connection", b"date"}
_PARAM = re.compile(r"\{[^}/]+\}")


class AsgiBridge:
    """Calls ``app`` for one request and buffers its answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes = _route_table(app)

    async def answer(
        self,
        method: bytes,
        version: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        path: str,
        raw_path: bytes,
        query: bytes,
        server: tuple[str, int],
        client: tuple[str, int] | None,
        lost: Callable[[], Awaitable[None]],
    ) -> Answer:
        """The app's answer to one request; for HEAD, the answer to GET (the caller leaves the body out)."""
        verb = "GET" if method == b"HEAD" else method.decode("latin-1")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "method": verb,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "server": server,
            "client": client,
            "state": {},
        }
        body_sent = False
        status = 500
        out_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await lost()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            nonlocal status, out_headers
            if message["type"] == "http.response.start":
                status = message["status"]
                out_headers = [(k.lower(), v) for k, v in message.get("headers", ()) if k.lower() not in _SKIPPED]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        except Exception:
            logger.exception("unhandled error serving %s %s", verb, path)
            return 500, encode_error("internal server error; see the server log"), _JSON, (), ()
        if status == 405 and not any(k == b"allow" for k, _ in out_headers):
            allowed = self.allowed(path)
            if allowed:
                out_headers.append((b"allow", ", ".join(allowed).encode()))
        return status, b"".join(chunks), None, tuple(out_headers), ()

    def allowed(self, path: str) -> list[str]:
        """The methods the app answers on ``path`` (HEAD wherever GET is), from the most specific routes that match;
        empty when the app has no route table or no route matches."""
        fewest = -1
        methods: set[str] = set()
        for pattern, params, route_methods in self._routes:
            if pattern.fullmatch(path) is None:
                continue
            if fewest < 0 or params < fewest:
                fewest, methods = params, set(route_methods)
            elif params == fewest:
                methods.update(route_methods)
        if "GET" in methods:
            methods.add("HEAD")
        return sorted(methods)


def _route_table(app: ASGIApp) -> list[tuple[re.Pattern[str], int, frozenset[str]]]:
    """(path pattern, number of path parameters, methods) of each route of a Litestar-like app."""
    table = []
    for route in getattr(app, "routes", None) or ():
        path_format = getattr(route, "path_format", None)
        methods = getattr(route, "methods", None)
        if not isinstance(path_format, str) or not methods:
            continue
        parts = _PARAM.split(path_format)
        pattern = "[^/]+".join(re.escape(p) for p in parts)
        table.append((re.compile(pattern), len(parts) - 1, frozenset(str(m) for m in methods)))
    return table
