"""/docs in a real headless Chromium against a real ``logicd serve`` process, offline: Swagger UI renders the
service's operations, Try-it sends a request and shows the server's answer, and the page asks nothing of any
other origin (a proxy that refuses everything stands between Chromium and the world), under its CSP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from modelsvc.tools import onnx_models as om
from tests._browser import Browser, Page, ensure_chromium
from tests._server import LogicdProcess
from tests.conftest import identity_config

# the first test may wait for apt-get to install chromium (see tests/_browser.py)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

XSS = '<img src=x onerror=alert(1)> <script>alert("x")</script>'
VALUES = [float(i) / 2 for i in range(16)]

SERVICE = f'''\
"""A test service: POST /v1/echo sends 16 numbers through the identity model."""

import numpy as np
from msgspec import Struct

from logicd import Context, Service


class Echo(Struct):
    values: list[float]


service = Service()


@service.post("/v1/echo")
async def echo(request: Echo, ctx: Context) -> Echo:
    """Send the values through the identity model. {XSS}"""
    async with ctx.stage("model"):
        out = await ctx.model("identity").infer(INPUT0=np.asarray([request.values], np.float32))
    return Echo(values=out["OUTPUT0"][0].tolist())
'''

CONFIG = """\
name: echo-docs
service: echo_service:service
model_service:
  url: embedded
  model_repository: ./model_repository
models: [identity]
"""


@pytest.fixture(scope="session")
def chromium() -> str:
    return ensure_chromium()


@pytest.fixture(scope="module")
def logic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogicdProcess]:
    folder = tmp_path_factory.mktemp("echo-docs")
    (folder / "echo_service.py").write_text(SERVICE)
    (folder / "service.yaml").write_text(CONFIG)
    om.write_model(folder / "model_repository", "identity", om.identity(), identity_config("identity"))
    with LogicdProcess(folder, "embedded") as process:
        yield process


@pytest.fixture
def page(chromium: str, logic: LogicdProcess) -> Iterator[Page]:
    with Browser(chromium) as browser, browser.new_page() as tab:
        tab.goto(f"{logic.base}/docs")
        yield tab


def assert_only_own_origin(page: Page, base: str) -> None:
    """Every request the page made went to the server; nothing failed, threw, was blocked or logged an error."""
    remote = [url for url in page.requests if urlsplit(url).scheme not in ("data", "blob")]
    assert remote, "the page made no request at all"
    assert [url for url in remote if not url.startswith(f"{base}/")] == []
    assert page.failed == []
    assert page.console_errors == []  # CSP violations are reported here
    assert page.exceptions == []
    assert page.dialogs == []  # the description's script and onerror never ran


OPERATION = "document.querySelector('#operations-default-echo')"


def test_swagger_ui_renders_the_operations_offline(page: Page, logic: LogicdProcess) -> None:
    text = page.wait_for("document.querySelector('.opblock-summary-path')?.textContent")
    assert text.replace("\u200b", "") == "/v1/echo"
    assert page.evaluate("document.title") == "echo-docs"
    assert page.wait_for("document.querySelector('.info .title')?.textContent").startswith("echo-docs")
    # the summary (the docstring's first line) is shown as text: none of its HTML made it into the page
    summary = page.evaluate(f"{OPERATION}.querySelector('.opblock-summary-description').textContent")
    assert summary == f"Send the values through the identity model. {XSS}"
    assert page.evaluate("document.querySelectorAll('#swagger-ui script, #swagger-ui img[src=x]').length") == 0
    assert_only_own_origin(page, logic.base)
    assert any(url.endswith("/schema/openapi.json") for url in page.requests)
    assert any(url.endswith("/swagger-ui-bundle.js") for url in page.requests)


def test_try_it_out_shows_the_live_response(page: Page, logic: LogicdProcess) -> None:
    page.wait_for(OPERATION)
    page.evaluate(f"{OPERATION}.querySelector('.opblock-summary-control').click()")
    page.wait_for(f"{OPERATION}.querySelector('.try-out__btn')")
    page.evaluate(f"{OPERATION}.querySelector('.try-out__btn').click()")
    page.wait_for(f"{OPERATION}.querySelector('textarea.body-param__text')")
    body = json.dumps({"values": VALUES})
    # a React-controlled textarea: set the value through the native setter, then tell React with an input event
    page.evaluate(f"""(() => {{
        const area = {OPERATION}.querySelector('textarea.body-param__text');
        Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(area, {json.dumps(body)});
        area.dispatchEvent(new Event('input', {{ bubbles: true }}));
    }})()""")
    page.evaluate(f"{OPERATION}.querySelector('button.execute').click()")
    live = f"{OPERATION}.querySelector('.live-responses-table tr.response"
    status = page.wait_for(f"{live} .response-col_status')?.textContent")
    assert status.strip() == "200"
    shown = page.evaluate(f"{live} .response-col_description .highlight-code pre').textContent")
    assert json.loads(shown) == {"values": VALUES}
    assert f"{logic.base}/v1/echo" in page.requests
    assert_only_own_origin(page, logic.base)
