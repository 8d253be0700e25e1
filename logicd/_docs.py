"""API docs at ``/docs``: Swagger UI served by the app itself, so the page works offline (air-gapped clusters).

Litestar's own UI pages load their code, a favicon and fonts from CDNs, and inline the schema into their script
unescaped. Here the Swagger UI files come from the installed ``swagger-ui-bundle-v2`` package and are served
under ``{path}/assets/<swagger-ui version>/`` (cached for a year: the version is in the URL); the page fetches
the schema from ``schema_path`` and starts Swagger UI with one small inline script::

    app = Litestar(
        route_handlers=[*handlers, *docs_handlers()],
        openapi_config=openapi_config("classifier", "1.0.0"),
    )

The page is sent with a Content-Security-Policy that allows scripts, styles, images and requests from its own
origin only (and its inline script by hash), so a browser refuses anything else, whatever the schema holds.
"""

from __future__ import annotations

import base64
import hashlib
import html
import importlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.enums import MediaType
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.params import FromPath

__all__ = ["Problem", "close_unknown_fields", "docs_handlers", "openapi_config", "problem_responses"]

# The files of the Swagger UI distribution that the page uses, with their content types. Only these are served:
# the distribution's own index.html and swagger-initializer.js would load a demo schema from another origin.
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
_IMMUTABLE = "public, max-age=31536000, immutable"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" type="image/png" href="{assets}/favicon-32x32.png" sizes="32x32">
<link rel="icon" type="image/png" href="{assets}/favicon-16x16.png" sizes="16x16">
<link rel="stylesheet" href="{assets}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>{script}</script>
</body>
</html>
"""

# validatorUrl null: no badge image from validator.swagger.io; the schema's URL is fixed (no ?url= override).
_SCRIPT = (
    "window.ui = SwaggerUIBundle(Object.assign({{"
    'dom_id: "#swagger-ui", deepLinking: true, validatorUrl: null, queryConfigEnabled: false, '
    "presets: [SwaggerUIBundle.presets.apis]}}, {config}));"
)


class Problem(msgspec.Struct, omit_defaults=True):
    """An error answer (RFC 9457 problem details), as every 4xx and 5xx of a service's routes is sent."""

    type: str
    title: str
    status: int
    detail: str
    """What is wrong, in words (the field or header it names, the limit it broke)."""
    instance: str
    """The request's path."""
    field: str | None = None
    """The request field at fault, when one is (``texts[2]``)."""
    errors: list[dict[str, Any]] | None = None
    """Each field that failed validation (400)."""


#: what the routes of every service may answer besides 200, each as application/problem+json
_PROBLEMS = {
    400: "The body is not valid JSON, misses a field or has one of the wrong type, or a deadline header is malformed",
    404: "The request names something the service does not have (a model, say)",
    413: "The body is larger than limits.max_body_bytes, or too large for the model service",
    422: "A field is well formed but its value is refused (an empty text, too many windows; `field` names it)",
    429: "The service limits this caller's rate",
    503: "At capacity (admission), or the model service is unavailable; see Retry-After",
    504: "The caller's deadline (Request-Timeout or grpc-timeout) passed, or the model service was too slow",
}


def problem_responses(*, auth: bool) -> dict[int, ResponseSpec]:
    """The OpenAPI responses of a service route besides its 200: problem+json, with 401 when auth is on."""
    codes = dict(_PROBLEMS)
    if auth:
        codes[401] = "No API key or bearer token, or one that is not accepted"
    return {
        status: ResponseSpec(
            data_container=Problem, description=text, media_type="application/problem+json", generate_examples=False
        )
        for status, text in sorted(codes.items())
    }


def _structs(types: list[Any]) -> dict[str, type[msgspec.Struct]]:
    """The msgspec Structs among ``types`` and inside their fields, by name."""
    found: dict[str, type[msgspec.Struct]] = {}
    todo = list(types)
    while todo:
        kind = todo.pop()
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and kind.__name__ not in found:
            found[kind.__name__] = kind
            todo += [field.type for field in msgspec.structs.fields(kind)]
        else:
            todo += list(getattr(kind, "__args__", ()))  # list[Item], Item | None, Annotated[...]
    return found


def close_unknown_fields(app: Any, types: list[Any]) -> None:
    """Mark ``additionalProperties: false`` in the OpenAPI document on every Struct of ``types`` (and of their
    fields) that refuses unknown fields (``forbid_unknown_fields=True``), which Litestar leaves out: the document
    then says what the route answers with a 400. Run once the routes are registered (at start-up)."""
    closed = {name for name, kind in _structs(types).items() if kind.__struct_config__.forbid_unknown_fields}
    components = app.openapi_schema.components
    for schema in (components.schemas or {}).values() if components else ():
        if getattr(schema, "title", None) in closed:
            schema.additional_properties = False


def openapi_config(title: str, version: str, *, path: str = "/schema", description: str | None = None) -> OpenAPIConfig:
    """OpenAPI settings that serve the schema as JSON only, at ``{path}/openapi.json`` (and at ``path``).

    No CDN-based UI is registered; pair it with :func:`docs_handlers` for a page to read the schema with.
    """
    return OpenAPIConfig(
        title=title, version=version, description=description, path=path, render_plugins=[JsonRenderPlugin()]
    )


def docs_handlers(
    *, schema_path: str = "/schema/openapi.json", path: str = "/docs", title: str | None = None
) -> list[HTTPRouteHandler]:
    """Route handlers serving Swagger UI at ``path`` and its files under ``{path}/assets/`` (left out of the schema).

    Args:
        schema_path: Where the page fetches the OpenAPI JSON, relative to the page's origin.
        path: Where the page is served.
        title: The browser tab's title; by default the app's OpenAPI title.
    """
    path = path.rstrip("/") or "/"
    assets = f"{path.rstrip('/')}/assets/{_swagger_ui().name}"
    script = _SCRIPT.format(config=_script_json({"url": schema_path}))
    headers = {"Content-Security-Policy": _content_security_policy(script), "Cache-Control": "no-cache"}

    @get(path, include_in_schema=False, media_type=MediaType.HTML, sync_to_thread=False)
    def docs_page(request: Request[Any, Any, Any]) -> Response[bytes]:
        name = title or (request.app.openapi_config.title if request.app.openapi_config else None) or "API docs"
        page = _PAGE.format(title=html.escape(name), assets=html.escape(assets), script=script)
        return Response(page.encode(), media_type=MediaType.HTML, headers=headers)

    @get(f"{assets}/{{name:str}}", include_in_schema=False, sync_to_thread=False)
    def docs_asset(name: FromPath[str]) -> Response[bytes]:
        if name not in _ASSETS:
            raise NotFoundException()
        headers = {"Cache-Control": _IMMUTABLE, "X-Content-Type-Options": "nosniff"}
        return Response(_read_asset(name), media_type=_ASSETS[name], headers=headers)

    return [docs_page, docs_asset]


@cache
def _swagger_ui() -> Path:
    """The installed Swagger UI distribution's folder, named ``swagger-ui-<version>``."""
    bundle = importlib.import_module("swagger_ui_bundle")  # swagger-ui-bundle-v2 (untyped)
    return Path(bundle.swagger_ui_path)


@cache
def _read_asset(name: str) -> bytes:
    return (_swagger_ui() / name).read_bytes()


def _script_json(value: object) -> str:
    """JSON to put inside a <script> element: escapes what could end the element or open a comment there."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _content_security_policy(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (
        "default-src 'none'; "
        f"script-src 'self' 'sha256-{digest}'; style-src 'self'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    )
