"""The README's examples run as written, against the quickstart repository the main command serves."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests._server import ROOT, ModelsvcProcess

pytestmark = pytest.mark.integration

README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


@pytest.fixture(scope="module")
def quickstart():
    with ModelsvcProcess(ROOT / "services" / "quickstart" / "model_repository") as proc:
        yield proc


def test_readme_opens_with_the_two_commands():
    first_two = _blocks("bash")[:2]
    # the main command ends with what the doc_classifier end-to-end test runs: build, then `logicd up`
    assert first_two[0].strip().endswith("-m services.build && .venv/bin/logicd up services/doc_classifier")
    assert "pytest" in first_two[1]
    assert "modelsvc serve --model-repository services/quickstart/model_repository" in _blocks("bash")[2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert first_two[1].strip() in ci  # .ci/run runs exactly the README's test command


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_examples(quickstart):
    try_it = (
        _blocks("bash")[3]
        .replace("localhost:8000", quickstart.url)
        .replace("localhost:8002", f"127.0.0.1:{quickstart.metrics_port}")
    )
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", try_it], capture_output=True, text=True, check=True)
    assert '"max_batch_size":32' in out.stdout
    assert '"data":[2.0,3.0,4.0' in out.stdout  # add_sub: INPUT0 + 1
    assert 'nv_inference_request_success{model="add_sub",version="1"} 1.0' in out.stdout


@pytest.mark.parametrize(("index", "expected"), [(0, "[[1. 1. 1."), (1, "[[2. 2. 2.")], ids=["tritonclient", "client"])
def test_readme_python_examples(quickstart, index, expected):
    code = _blocks("python")[index].replace("localhost:8000", quickstart.url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert expected in out.stdout


def test_readme_logicd_example_defines_a_service():
    namespace: dict[str, object] = {}
    exec(_blocks("python")[2], namespace)
    service = namespace["service"]
    assert [(r.method, r.path, r.request_type.__name__, r.response_type.__name__) for r in service.routes] == [
        ("POST", "/v1/score", "Documents", "Scores")
    ]
