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

from litestar import Request, Response, get
from litestar.enums import MediaType
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.params import FromPath

__all__ = ["docs_handlers", "openapi_config"]

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
