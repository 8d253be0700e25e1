"""An API docs page that works offline: no script, style, font or image from anywhere but the page itself.

Litestar's own docs UIs (Swagger, ReDoc, Scalar, ...) load their code from CDNs, which air-gapped clusters
cannot reach. Here the app serves only the OpenAPI JSON, and one self-contained HTML page (``docs.html``:
inline CSS and plain JavaScript) fetches it and renders the operations, their schemas and a Try-it panel::

    app = Litestar(
        route_handlers=[*handlers, *docs_handlers()],
        openapi_config=openapi_config("classifier", "1.0.0"),
    )

The page is sent with a Content-Security-Policy that allows exactly its own inline script and style (by
hash) and requests to its own origin, so a browser refuses anything else, whatever the schema holds.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from functools import cache
from importlib.resources import files

from litestar import Response, get
from litestar.enums import MediaType
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin

__all__ = ["docs_handlers", "openapi_config"]

_TITLE = "__LOGICD_DOCS_TITLE__"
_CONFIG = "__LOGICD_DOCS_CONFIG__"


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
    """Route handlers serving the offline docs page at ``path`` (left out of the schema).

    Args:
        schema_path: Where the page fetches the OpenAPI JSON, relative to the page's origin.
        path: Where the page is served.
        title: The browser tab's title; by default the schema's ``info.title``.
    """
    page = _render(schema_path=schema_path, title=title)
    headers = {"Content-Security-Policy": _content_security_policy(), "Cache-Control": "no-cache"}

    @get(path, include_in_schema=False, media_type=MediaType.HTML, sync_to_thread=False)
    def docs_page() -> Response[bytes]:
        return Response(page, media_type=MediaType.HTML, headers=headers)

    return [docs_page]


@cache
def _template() -> str:
    return files("logicd").joinpath("docs.html").read_text(encoding="utf-8")


def _render(*, schema_path: str, title: str | None) -> bytes:
    config = json.dumps({"schemaPath": schema_path, "title": title})
    # JSON inside <script>: escape what could end the element or open a comment there.
    config = config.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    page = _template().replace(_TITLE, html.escape(title or "API docs")).replace(_CONFIG, config)
    return page.encode()


@cache
def _content_security_policy() -> str:
    template = _template()
    scripts = re.findall(r"<script>(.*?)</script>", template, flags=re.S)
    styles = re.findall(r"<style>(.*?)</style>", template, flags=re.S)
    script_src = " ".join(_hash_source(text) for text in scripts)
    style_src = " ".join(_hash_source(text) for text in styles)
    return (
        "default-src 'none'; "
        f"script-src {script_src}; style-src {style_src}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    )


def _hash_source(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"
