"""The offline docs page: Swagger UI from the app's own assets under a strict CSP, and JSON-only OpenAPI.
Rendering and Try-it in a real browser: tests/logicd/test_logicd_docs_browser.py."""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest
import swagger_ui_bundle
from litestar import Litestar, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.testing import TestClient

from logicd._docs import docs_handlers, openapi_config

XSS = '<script>alert("x")</script>'
SWAGGER_UI = Path(swagger_ui_bundle.swagger_ui_path)
ASSETS = f"/docs/assets/{SWAGGER_UI.name}"


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Item(msgspec.Struct):
    sku: Annotated[str, msgspec.Meta(min_length=3, description="Stock-keeping unit.")]
    quantity: Annotated[int, msgspec.Meta(ge=1, le=100)]
    notes: list[str] = []


class Order(msgspec.Struct):
    customer: str
    items: Annotated[list[Item], msgspec.Meta(min_length=1)]
    mode: Literal["fast", "cheap"]
    priority: Priority
    coupon: str | None = None
    parent: Order | None = None


class Receipt(msgspec.Struct):
    order_id: int
    total_items: int


class Query(msgspec.Struct):
    text: Annotated[str, msgspec.Meta(description=XSS)]
    top_k: int = 3


class Hits(msgspec.Struct):
    hits: list[str]
    scores: dict[str, float]


@post("/v1/orders", summary="Place an order", status_code=201)
async def place_order(data: JSONBody[Order]) -> Receipt:
    return Receipt(order_id=7, total_items=sum(item.quantity for item in data.items))


@post("/v1/search", summary="Search", description=f"Finds things. {XSS}", status_code=200)
async def search(data: JSONBody[Query]) -> Hits:
    return Hits(hits=[data.text] * data.top_k, scores={data.text: 1.0})


@get("/v1/orders/{order_id:int}", summary="Get an order")
async def order(order_id: FromPath[int], verbose: FromQuery[bool] = False) -> Receipt:
    return Receipt(order_id=order_id, total_items=0)


def make_app(**docs: Any) -> Litestar:
    return Litestar(
        route_handlers=[place_order, search, order, *docs_handlers(**docs)],
        openapi_config=openapi_config("Shop", "1.2.3", description=f"The shop API. {XSS}"),
    )


@pytest.fixture
def client() -> Iterator[TestClient[Litestar]]:
    with TestClient(make_app()) as client:
        yield client


def inline_scripts(page: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", page, flags=re.S)


def test_page_loads_only_its_own_files(client: TestClient[Litestar]) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    page = response.text
    assert "<title>Shop</title>" in page  # the schema's title by default
    assert not re.search(r"https?://|//[a-z]", page)
    sources = re.findall(r"\b(?:src|href)\s*=\s*\"([^\"]*)\"", page)
    names = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "favicon-16x16.png")
    assert sorted(sources) == sorted(f"{ASSETS}/{name}" for name in names)
    (script,) = inline_scripts(page)
    assert "SwaggerUIBundle(" in script
    assert '"url": "/schema/openapi.json"' in script
    assert "validatorUrl: null" in script  # no badge image from validator.swagger.io
    assert "<style" not in page


def test_csp_allows_only_the_own_origin_and_the_inline_script(client: TestClient[Litestar]) -> None:
    response = client.get("/docs")
    csp = response.headers["content-security-policy"]
    (script,) = inline_scripts(response.text)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives == {
        "default-src": "'none'",
        "script-src": f"'self' 'sha256-{digest}'",
        "style-src": "'self'",
        "connect-src": "'self'",
        "img-src": "'self' data:",
        "base-uri": "'none'",
        "form-action": "'none'",
        "frame-ancestors": "'self'",
    }


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
        ("swagger-ui.css", "text/css; charset=utf-8"),
        ("favicon-32x32.png", "image/png"),
        ("favicon-16x16.png", "image/png"),
    ],
)
def test_assets_are_served_from_the_package_with_types_and_caching(
    client: TestClient[Litestar], name: str, content_type: str
) -> None:
    response = client.get(f"{ASSETS}/{name}")
    assert response.status_code == 200
    assert response.content == (SWAGGER_UI / name).read_bytes()
    assert response.headers["content-type"] == content_type
    assert response.headers["cache-control"] == "public, max-age=31536000, immutable"  # the version is in the URL
    assert response.headers["x-content-type-options"] == "nosniff"


def test_only_the_pages_assets_are_served(client: TestClient[Litestar]) -> None:
    # the distribution's own index.html and initializer load a demo schema from another origin
    for name in ("index.html", "swagger-initializer.js", "oauth2-redirect.html", "nothing.js", "..%2Fswagger-ui.css"):
        assert client.get(f"{ASSETS}/{name}").status_code == 404, name
    assert client.get("/docs/assets/swagger-ui-0.0.0/swagger-ui.css").status_code == 404


def test_schema_is_served_as_json_only(client: TestClient[Litestar]) -> None:
    response = client.get("/schema/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["info"] == {"title": "Shop", "version": "1.2.3", "description": f"The shop API. {XSS}"}
    assert set(schema["paths"]) == {"/v1/orders", "/v1/search", "/v1/orders/{order_id}"}
    assert "/docs" not in schema["paths"]
    for ui in ("swagger", "redoc", "elements", "rapidoc", "scalar"):
        assert client.get(f"/schema/{ui}").status_code == 404


def test_title_and_paths_are_configurable_and_escaped() -> None:
    app = make_app(path="/api-docs", schema_path="/schema/openapi.json?v=</script>", title="<b>Shop</b>")
    with TestClient(app) as client:
        assert client.get("/docs").status_code == 404
        page = client.get("/api-docs").text
        assets = f"/api-docs/assets/{SWAGGER_UI.name}"
        assert client.get(f"{assets}/swagger-ui.css").status_code == 200
    assert "<title>&lt;b&gt;Shop&lt;/b&gt;</title>" in page
    assert f'<script src="{assets}/swagger-ui-bundle.js"></script>' in page
    (script,) = inline_scripts(page)
    (config,) = re.findall(r"Object\.assign\(\{.*?\}, (\{.*\})\)\);$", script)
    assert json.loads(config) == {"url": "/schema/openapi.json?v=</script>"}
    assert "</script>" not in config
