"""The HTTP/REST transport of the v2 protocol: a thin layer over the data plane.

Control routes are ordinary Litestar handlers. The infer route is a raw ASGI handler: it is the
hot path, and it needs the body as bytes, the binary-extension header, and a watch on the client's
connection (a request whose client went away is withdrawn from the queue).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException
from litestar.types import Receive, Scope, Send

from ..protocol import (
    HEADER_CONTENT_LENGTH,
    InvalidArgument,
    decode_infer_request,
    encode_error,
    encode_infer_response,
    encode_json,
)
from ._dataplane import DataPlane
from ._errors import http_error

logger = logging.getLogger("modelsvc.http")

_JSON = "application/json"
_HEADER_KEY = HEADER_CONTENT_LENGTH.encode()


def _json(value: Any, status: int = 200) -> Response[bytes]:
    return Response(encode_json(value), status_code=status, media_type=_JSON)


def _error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    if isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        status, message = http_error(exc)
        if status == 500:
            logger.error("internal error on %s", request.url.path, exc_info=exc)
    return Response(encode_error(message), status_code=status, media_type=_JSON)


def create_http_app(dataplane: DataPlane, *, max_body_size: int = 64 * 1024 * 1024) -> HttpFront:
    """The v2 HTTP app over ``dataplane``; bodies over ``max_body_size`` bytes get 413."""

    @get("/v2/health/live", media_type=_JSON, sync_to_thread=False)
    def live() -> Response[bytes]:
        return Response(b"", status_code=200 if dataplane.live() else 400)

    @get("/v2/health/ready", sync_to_thread=False)
    def ready() -> Response[bytes]:
        return Response(b"", status_code=200 if dataplane.ready() else 400)

    @get("/v2", sync_to_thread=False)
    def server_metadata() -> Response[bytes]:
        return _json(dataplane.server_metadata())

    @get(
        ["/v2/models/{model_name:str}", "/v2/models/{model_name:str}/versions/{model_version:str}"],
        sync_to_thread=False,
    )
    def model_metadata(model_name: str, model_version: str | None = None) -> Response[bytes]:
        return _json(dataplane.model_metadata(model_name, model_version))

    @get(
        [
            "/v2/models/{model_name:str}/ready",
            "/v2/models/{model_name:str}/versions/{model_version:str}/ready",
        ],
        sync_to_thread=False,
    )
    def model_ready(model_name: str, model_version: str | None = None) -> Response[bytes]:
        return Response(b"", status_code=200 if dataplane.model_ready(model_name, model_version) else 400)

    @get(
        [
            "/v2/models/{model_name:str}/config",
            "/v2/models/{model_name:str}/versions/{model_version:str}/config",
        ],
        sync_to_thread=False,
    )
    def model_config(model_name: str, model_version: str | None = None) -> Response[bytes]:
        return _json(dataplane.model_config(model_name, model_version))

    @get(
        [
            "/v2/models/stats",
            "/v2/models/{model_name:str}/stats",
            "/v2/models/{model_name:str}/versions/{model_version:str}/stats",
        ],
        sync_to_thread=False,
    )
    def statistics(model_name: str | None = None, model_version: str | None = None) -> Response[bytes]:
        return _json(dataplane.statistics(model_name, model_version))

    @post("/v2/repository/index", status_code=200)
    async def repository_index(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = await request.body()
        ready_only = False
        if body.strip():
            try:
                parsed = msgspec.json.decode(body)
            except msgspec.DecodeError as exc:
                raise InvalidArgument(f"repository index request is not valid JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise InvalidArgument("repository index request must be a JSON object")
            ready_only = bool(parsed.get("ready", False))
        return _json(dataplane.repository_index(ready_only))

    @post(
        [
            "/v2/models/{model_name:str}/infer",
            "/v2/models/{model_name:str}/versions/{model_version:str}/infer",
        ],
        include_in_schema=False,
    )
    async def infer(model_name: str, model_version: str | None = None) -> None:
        raise AssertionError("served by HttpFront")  # pragma: no cover - the front answers first

    app = Litestar(
        route_handlers=[
            live,
            ready,
            server_metadata,
            model_metadata,
            model_ready,
            model_config,
            statistics,
            repository_index,
            infer,
        ],
        exception_handlers={Exception: _error_response},
        request_max_body_size=max_body_size,
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    return HttpFront(app, _InferHandler(dataplane, max_body_size))


class HttpFront:
    """ASGI front: ``POST .../infer`` goes straight to the infer handler, the rest to Litestar."""

    __slots__ = ("app", "infer")

    def __init__(self, app: Litestar, infer: _InferHandler) -> None:
        self.app = app
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP and scope["method"] == "POST":
            target = _infer_target(scope["path"])
            if target is not None:
                await self.infer(target[0], target[1], scope, receive, send)
                return
        await self.app(scope, receive, send)


def _infer_target(path: str) -> tuple[str, str | None] | None:
    """``/v2/models/M/infer`` -> (M, None); ``/v2/models/M/versions/V/infer`` -> (M, V); else None."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


#: a request still unanswered this long after it arrived starts watching its connection
WATCH_AFTER_S = 0.002


class _InferHandler:
    __slots__ = ("_loop", "dataplane", "max_body_size")

    def __init__(self, dataplane: DataPlane, max_body_size: int) -> None:
        self.dataplane = dataplane
        self.max_body_size = max_body_size
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, model: str, version: str | None, scope: Scope, receive: Receive, send: Send) -> None:
        header_length: int | None = None
        declared = -1
        try:
            for key, value in scope["headers"]:
                if key == _HEADER_KEY:
                    header_length = _header_int(value, HEADER_CONTENT_LENGTH)
                elif key == b"content-length":
                    declared = _header_int(value, "content-length")
        except InvalidArgument as exc:
            await _send(send, 400, encode_error(exc.message), _JSON)
            return
        if declared > self.max_body_size:
            await _send(send, 413, encode_error(self._too_large(declared)), _JSON)
            return
        body = await self._read_body(receive, send)
        if body is None:
            return
        try:
            request = decode_infer_request(body, header_length)
            response = await self._infer_watching(receive, model, version, request)
            if response is None:  # the client went away
                return
            default = request.binary_data_output
            wanted = {o.name: o.binary for o in request.outputs or ()}
            flags = [default if wanted.get(t.name) is None else bool(wanted[t.name]) for t in response.outputs]
            payload, json_length = encode_infer_response(response, flags)
        except Exception as exc:
            status, message = http_error(exc)
            if status == 500:
                logger.error("inference on model %s failed", model, exc_info=exc)
            await _send(send, status, encode_error(message), _JSON)
            return
        if json_length is None:
            await _send(send, 200, payload, _JSON)
        else:
            await _send(
                send,
                200,
                payload,
                "application/octet-stream",
                ((_HEADER_KEY, str(json_length).encode()),),
            )

    def _too_large(self, size: int) -> str:
        return f"request body of {size} bytes exceeds the limit of {self.max_body_size} bytes"

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            if chunk:
                size += len(chunk)
                if size > self.max_body_size:
                    await _send(send, 413, encode_error(self._too_large(size)), _JSON)
                    return None
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _infer_watching(self, receive: Receive, name: str, version: str | None, request: Any) -> Any:
        """Run the inference while watching the connection; None if the client disconnected.

        Most requests are answered within a few milliseconds, so the watch (a task waiting on
        ``receive()`` for ``http.disconnect``) starts only once a request has waited WATCH_AFTER_S;
        a request abandoned while it waits in the queue is withdrawn and never runs.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        state: dict[str, Any] = {"gone": False, "watch": None}

        def on_message(watch: asyncio.Task[Any]) -> None:
            if not watch.cancelled() and watch.exception() is None and watch.result()["type"] == "http.disconnect":
                state["gone"] = True
                task.cancel()

        def start_watch() -> None:
            watch: asyncio.Task[Any] = loop.create_task(receive())  # type: ignore[arg-type]
            watch.add_done_callback(on_message)
            state["watch"] = watch

        timer = loop.call_later(WATCH_AFTER_S, start_watch)
        try:
            return await self.dataplane.infer(name, version, request)
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()
            logger.debug("client went away; request for %s withdrawn", name)
            return None
        finally:
            timer.cancel()
            watch = state["watch"]
            if watch is not None:
                watch.remove_done_callback(on_message)
                watch.cancel()


def _header_int(value: bytes, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"header {name} must be an integer, got {value!r}") from None
    if number < 0:
        raise InvalidArgument(f"header {name} must not be negative")
    return number


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
