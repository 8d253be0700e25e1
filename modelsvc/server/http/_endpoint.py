"""The HTTP/REST transport of the v2 protocol: a thin layer over the data plane.

Every route is an ordinary Litestar handler. Inference goes through ``InferEndpoint`` (bytes in,
bytes out), which the fast HTTP server in ``_server`` also calls directly on its hot path.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException

from ...engine import DataPlane, DecoupledRefused, http_error
from ...protocol import (
    HEADER_CONTENT_LENGTH,
    InvalidArgument,
    decode_infer_request,
    encode_error,
    encode_infer_response_parts,
    encode_json,
)
from .._restricted import ApiCategory, RestrictedApis, http_category

logger = logging.getLogger("modelsvc.http")

_JSON = "application/json"
_JSON_BYTES = b"application/json"
_BINARY = b"application/octet-stream"
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


def create_http_app(
    dataplane: DataPlane, *, max_body_size: int = 64 * 1024 * 1024, restricted: RestrictedApis | None = None
) -> Litestar:
    """The complete v2 HTTP app over ``dataplane`` (bodies over ``max_body_size`` bytes get 413).

    It runs under any ASGI server; ``modelsvc serve`` puts the fast HTTP server in front of it, which
    answers ``POST .../infer`` itself through an InferEndpoint given the same ``restricted``: requests to a
    restricted category without its header get 403 (``--http-restricted-api``).
    """

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
            ready_only = bool(_json_object(body, "repository index").get("ready", False))
        return _json(dataplane.repository_index(ready_only))

    @post("/v2/repository/models/{model_name:str}/load", status_code=200)
    async def load_model(request: Request[Any, Any, Any], model_name: str) -> Response[bytes]:
        params = _repository_parameters(await request.body(), "load")
        config = params.get("config")
        if config is not None and not isinstance(config, str):
            raise InvalidArgument("load parameter 'config' must be a string: the model configuration as JSON")
        files = {key: _base64(key, value) for key, value in params.items() if key.startswith("file:")}
        await dataplane.load_model(model_name, config, files or None)
        return Response(b"", status_code=200)

    @post("/v2/repository/models/{model_name:str}/unload", status_code=200)
    async def unload_model(request: Request[Any, Any, Any], model_name: str) -> Response[bytes]:
        params = _repository_parameters(await request.body(), "unload")
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidArgument("unload parameter 'unload_dependents' must be true or false")
        await dataplane.unload_model(model_name, dependents)
        return Response(b"", status_code=200)

    endpoint = InferEndpoint(dataplane, restricted)

    async def check_restricted(request: Request[Any, Any, Any]) -> Response[bytes] | None:
        """Refuse a request to a restricted category that lacks its header (infer checks in InferEndpoint)."""
        if not restricted:
            return None
        category = http_category(request.url.path)
        if category is None or category is ApiCategory.INFERENCE:
            return None
        message = restricted.denied(category, request.headers.items())
        return None if message is None else Response(encode_error(message), status_code=403, media_type=_JSON)

    @post(
        ["/v2/models/{model_name:str}/infer", "/v2/models/{model_name:str}/versions/{model_version:str}/infer"],
        status_code=200,
    )
    async def infer(
        request: Request[Any, Any, Any], model_name: str, model_version: str | None = None
    ) -> Response[bytes]:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        reply = await endpoint.handle(model_name, model_version, headers, await request.body())
        return Response(
            reply.body,
            status_code=reply.status,
            media_type=reply.content_type.decode(),
            headers={k.decode(): v.decode() for k, v in reply.headers},
        )

    return Litestar(
        route_handlers=[
            live,
            ready,
            server_metadata,
            model_metadata,
            model_ready,
            model_config,
            statistics,
            repository_index,
            load_model,
            unload_model,
            infer,
        ],
        before_request=check_restricted,
        exception_handlers={Exception: _error_response},
        request_max_body_size=max_body_size,
        openapi_config=None,
        logging_config=None,
        debug=False,
    )


def _repository_parameters(body: bytes, action: str) -> dict[str, Any]:
    """The ``parameters`` object of a load or unload request body (which may be empty)."""
    if not body.strip():
        return {}
    params = _json_object(body, action).get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument(f"{action} request 'parameters' must be a JSON object")
    return params


def _json_object(body: bytes, action: str) -> dict[str, Any]:
    """A control request's body as a JSON object; anything else is an InvalidArgument naming ``action``."""
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"{action} request is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's depth guard
        raise InvalidArgument(f"{action} request is not valid JSON: nested too deeply") from None
    except UnicodeDecodeError as exc:  # a string whose bytes are not UTF-8
        raise InvalidArgument(f"{action} request is not valid JSON: a string is not UTF-8: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"{action} request must be a JSON object")
    return parsed


def _base64(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"load parameter '{key}' must be a base64 string (the file's content)")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise InvalidArgument(f"load parameter '{key}' is not valid base64: {exc}") from None


def infer_target(path: str) -> tuple[str, str | None] | None:
    """``/v2/models/M/infer`` -> (M, None); ``/v2/models/M/versions/V/infer`` -> (M, V); else None."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class Reply(NamedTuple):
    status: int
    body: bytes
    content_type: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    tail: tuple[bytes, ...] = ()
    """More of the body after ``body`` (large binary outputs), only when ``handle`` was called with ``split``."""


_JOIN_UNDER = 64 * 1024
"""Binary outputs smaller than this (in all) are joined to the JSON header: one buffer for one write. Larger ones
stay apart (``Reply.tail``), written with one vectored write instead of being copied into a joined body."""


class InferEndpoint:
    """``POST .../infer``, bytes in and bytes out: shared by the Litestar route and the fast HTTP server.

    A client that goes away cancels the awaiting task; the data plane then withdraws the request
    from its model's queue, so it never runs.
    """

    __slots__ = ("dataplane", "restricted")

    def __init__(self, dataplane: DataPlane, restricted: RestrictedApis | None = None) -> None:
        self.dataplane = dataplane
        self.restricted = restricted if restricted and restricted.restricts(ApiCategory.INFERENCE) else None
        """Set when inference needs a header (``--http-restricted-api inference:...``)."""

    async def handle(
        self,
        model: str,
        version: str | None,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        *,
        split: bool = False,
    ) -> Reply:
        """Answer one infer request; ``headers`` are the request's, names lower-case. ``split``: large binary
        outputs may come apart from ``Reply.body``, in ``Reply.tail`` (the server writes both with one writev).

        With tracing on, the request's W3C trace context is taken from ``headers`` and a sampled request
        gets a SERVER span (model, version, request id, outcome, status) with queue and compute children.
        """
        if self.restricted is not None:
            refused = self.restricted.denied(ApiCategory.INFERENCE, headers)
            if refused is not None:
                return Reply(403, encode_error(refused), _JSON_BYTES)
        tracing = self.dataplane.tracing
        trace = None if tracing is None else tracing.start(model, version, headers)
        header_length = None
        for key, value in headers:
            if key == _HEADER_KEY:
                header_length = value
                break
        try:
            length = None if header_length is None else _header_int(header_length, HEADER_CONTENT_LENGTH)
            request = decode_infer_request(body, length)
            if trace is not None:
                trace.request(request.id)
            response = await self.dataplane.infer(model, version, request, trace, endpoint="HTTP end point")
            default = request.binary_data_output
            wanted = {o.name: o.binary for o in request.outputs or ()}
            flags = [default if wanted.get(t.name) is None else bool(wanted[t.name]) for t in response.outputs]
            parts, json_length = encode_infer_response_parts(response, flags)
        except Exception as exc:
            status, message = http_error(exc)
            if status == 500:
                logger.error("inference on model %s failed", model, exc_info=exc)
            elif isinstance(exc, DecoupledRefused):
                status = DecoupledRefused.http_status  # Triton's 501, where other UNSUPPORTED errors are 400
            if trace is not None:
                trace.end(status, exc)
            return Reply(status, encode_error(message), _JSON_BYTES)
        except BaseException as exc:  # the caller went away (CancelledError)
            if trace is not None:
                trace.end(499, exc)
            raise
        if trace is not None:
            trace.end(200, None)
        if json_length is None:
            return Reply(200, parts[0], _JSON_BYTES)
        length_header = ((_HEADER_KEY, str(json_length).encode()),)
        if split and len(parts) > 1 and sum(map(len, parts)) - json_length >= _JOIN_UNDER:
            return Reply(200, parts[0], _BINARY, length_header, tuple(parts[1:]))
        return Reply(200, b"".join(parts), _BINARY, length_header)


def _header_int(value: bytes, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"header {name} must be an integer, got {value!r}") from None
    if number < 0:
        raise InvalidArgument(f"header {name} must not be negative")
    return number
