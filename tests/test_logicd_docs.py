"""The offline docs page: self-contained HTML, JSON-only OpenAPI, and JavaScript that renders (run under node)."""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest
from litestar import Litestar, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.testing import TestClient

from logicd._docs import docs_handlers, openapi_config

XSS = '<script>alert("x")</script>'


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


def inline(tag: str, page: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)


def test_page_is_self_contained_html(client: TestClient[Litestar]) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert not re.search(r"https?://", page)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", page, flags=re.I)
    assert "@import" not in page
    assert "url(" not in page
    assert len(inline("script", page)) == 1
    assert len(inline("style", page)) == 1


def test_csp_allows_only_the_inline_script_and_style(client: TestClient[Litestar]) -> None:
    response = client.get("/docs")
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "connect-src 'self'" in csp
    for tag in ("script", "style"):
        (source,) = inline(tag, response.text)
        digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
        assert f"{tag}-src 'sha256-{digest}';" in csp


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
    assert "<title>&lt;b&gt;Shop&lt;/b&gt;</title>" in page
    (config,) = re.findall(r'<script type="application/json" id="logicd-docs-config">(.*?)</script>', page, re.S)
    assert json.loads(config) == {"schemaPath": "/schema/openapi.json?v=</script>", "title": "<b>Shop</b>"}
    assert "</script>" not in config


# Runs the page's script under node: the pure functions on the real schema, then the page itself against a
# small fake DOM and fetch (Send clicked with an API key), and once more with a schema fetch that fails.
HARNESS = r"""
const fs = require("fs");
const [script, specFile, configText] = process.argv.slice(2);
const docs = require(script);
const spec = JSON.parse(fs.readFileSync(specFile, "utf8"));

class Text { constructor(data) { this.data = String(data); } get textContent() { return this.data; } }
class Element {
  constructor(tag) { this.tagName = tag; this.attributes = {}; this.childNodes = []; this.listeners = {};
                     this.value = ""; this.disabled = false; }
  setAttribute(k, v) { this.attributes[k] = String(v); }
  addEventListener(type, fn) { (this.listeners[type] = this.listeners[type] || []).push(fn); }
  appendChild(child) { this.childNodes.push(child); return child; }
  get textContent() { return this.childNodes.map((c) => c.textContent).join(""); }
  set textContent(v) { this.childNodes = v ? [new Text(v)] : []; }
  fire(type) { return Promise.all((this.listeners[type] || []).map((fn) => fn({ type, target: this }))); }
  *walk() { yield this; for (const c of this.childNodes) if (c instanceof Element) yield* c.walk(); }
}
function serialize(node) {
  if (node instanceof Text) return docs.escapeHtml(node.data);
  const attrs = Object.entries(node.attributes).map(([k, v]) => ` ${k}="${docs.escapeHtml(v)}"`).join("");
  return `<${node.tagName}${attrs}>${node.childNodes.map(serialize).join("")}</${node.tagName}>`;
}
function makeDocument() {
  const config = new Element("script"); config.textContent = configText;
  const root = new Element("main");
  return { root, title: "", createElement: (t) => new Element(t), createTextNode: (t) => new Text(t),
           getElementById: (id) => ({ "logicd-docs-config": config, "logicd-docs": root })[id] };
}
function reply(status, body, headers) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return Promise.resolve({ ok: status < 400, status, statusText: status < 400 ? "OK" : "Error",
    headers: { forEach: (cb) => Object.entries(headers || {}).forEach(([k, v]) => cb(v, k)) },
    text: () => Promise.resolve(text), json: () => Promise.resolve(JSON.parse(text)) });
}

(async () => {
  const ops = docs.operations(spec);
  const out = {
    operations: ops.map((o) => `${o.method.toUpperCase()} ${o.path}`),
    examples: Object.fromEntries(ops.filter((o) => o.mediaType).map((o) => [o.path, docs.exampleBody(spec, o)])),
    html: docs.toHtml(docs.renderSpec(spec)),
    bearer: docs.buildRequest(spec, ops.find((o) => o.method === "get"), { params: { "path:order_id": "9" } },
                              { scheme: "bearer", value: "tok" }),
    missingParam: docs.buildRequest(spec, ops.find((o) => o.method === "get"), { params: {} }, null),
    badJson: docs.buildRequest(spec, ops[0], { body: "{" }, null),
  };

  const sent = [];
  const doc = makeDocument();
  await docs.start(doc, (url, init) => {
    if (url === JSON.parse(configText).schemaPath) return reply(200, spec);
    sent.push({ url, method: init.method, headers: init.headers, body: init.body });
    return reply(201, { order_id: 7, note: "<img src=x onerror=alert(1)>" }, { "x-request-id": "abc" });
  }, () => 0);
  const elements = [...doc.root.walk()];
  const key = elements.find((e) => e.attributes["aria-label"] === "API key or token");
  key.value = "secret-key"; await key.fire("input");
  const send = elements.find((e) => e.tagName === "button" && e.textContent === "Send");
  await send.fire("click");
  out.page = serialize(doc.root);
  out.documentTitle = doc.title;
  out.sent = sent;

  const failing = makeDocument();
  await docs.start(failing, () => reply(503, "down"));
  out.failed = serialize(failing.root);
  const offline = makeDocument();
  await docs.start(offline, () => Promise.reject(new TypeError("Failed to fetch")));
  out.offline = serialize(offline.root);
  process.stdout.write(JSON.stringify(out));
})().catch((exc) => { console.error(exc); process.exit(1); });
"""


@pytest.fixture
def rendered(client: TestClient[Litestar], tmp_path: Path) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's JavaScript cannot be run")
    page = client.get("/docs").text
    (script,) = inline("script", page)
    (config,) = re.findall(r'<script type="application/json" id="logicd-docs-config">(.*?)</script>', page, re.S)
    (tmp_path / "docs.js").write_text(script)
    (tmp_path / "harness.js").write_text(HARNESS)
    (tmp_path / "spec.json").write_text(client.get("/schema/openapi.json").text)
    args = [node, str(tmp_path / "harness.js"), str(tmp_path / "docs.js"), str(tmp_path / "spec.json"), config]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_script_lists_operations_and_resolves_refs(rendered: dict[str, Any]) -> None:
    assert rendered["operations"] == ["POST /v1/orders", "POST /v1/search", "GET /v1/orders/{order_id}"]
    html = rendered["html"]
    for text in ("Place an order", "Search", "Get an order", "Shop", "1.2.3"):
        assert text in html
    # Order's $refs resolved: nested Item fields, the enum's values, Literal, optional and recursive members
    for text in (
        '<span class="type">Order</span>',
        '<span class="type">array of Item</span>',
        '<code class="prop">sku</code>',
        "Stock-keeping unit.",
        "minLength: <code>3</code>",
        "minimum: <code>1</code>",
        "&quot;low&quot;",
        "&quot;cheap&quot;",
        '<code class="prop">coupon</code><span class="type">string | null</span> <span class="badge">optional</span>',
        "Order (recursive) | null",
        '<span class="type">map of string → number</span>',
    ):
        assert text in html, text
    assert re.search(
        r'<code class="prop">customer</code><span class="type">string</span> <span class="badge req">', html
    )


def test_script_escapes_schema_text(rendered: dict[str, Any]) -> None:
    for html in (rendered["html"], rendered["page"]):
        assert "<script" not in html
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "<img" not in rendered["page"]
    assert "&lt;img src=x onerror=alert(1)&gt;" in rendered["page"]


def test_generated_examples_are_accepted_by_the_routes(rendered: dict[str, Any], client: TestClient[Litestar]) -> None:
    examples = rendered["examples"]
    assert set(examples) == {"/v1/orders", "/v1/search"}
    order = json.loads(examples["/v1/orders"])
    assert order["items"][0]["quantity"] == 1
    assert order["priority"] == "low"
    for path, body in examples.items():
        response = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code in (200, 201), (path, response.text)


def test_try_it_sends_the_example_with_the_api_key(rendered: dict[str, Any], client: TestClient[Litestar]) -> None:
    (request,) = rendered["sent"]
    assert request["method"] == "POST"
    assert request["url"] == "/v1/orders"
    assert request["headers"]["X-API-Key"] == "secret-key"
    assert request["headers"]["Content-Type"] == "application/json"
    response = client.request(request["method"], request["url"], content=request["body"], headers=request["headers"])
    assert response.status_code == 201
    # the answer is shown: status, headers, pretty-printed body
    page = rendered["page"]
    assert '<span class="status ok">201</span>' in page
    assert "x-request-id" in page
    assert "&quot;order_id&quot;: 7" in page
    assert rendered["documentTitle"] == "Shop · API docs"


def test_try_it_requests_are_checked_and_carry_bearer_tokens(rendered: dict[str, Any]) -> None:
    assert rendered["bearer"] == {
        "method": "GET",
        "url": "/v1/orders/9",
        "headers": {"Accept": "application/json", "Authorization": "Bearer tok"},
    }
    assert rendered["missingParam"] == {"error": "Parameter order_id (path) is required."}
    assert rendered["badJson"]["error"].startswith("The request body is not valid JSON")


def test_schema_fetch_errors_are_shown(rendered: dict[str, Any]) -> None:
    assert "Could not load the API schema" in rendered["failed"]
    assert "the server answered 503" in rendered["failed"]
    assert "Failed to fetch" in rendered["offline"]
    assert 'role="alert"' in rendered["offline"]
