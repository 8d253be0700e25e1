"""The README's examples run as written, against the quickstart repository the main command serves."""

from __future__ import annotations

import importlib.util
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



def test_readme_gpu_commands(tmp_path):
    """The GPU block as written, in a scratch folder: the export runs; `modelsvc build` refuses without TensorRT,
    naming the extra and writing nothing; `modelsvc compare` of the ONNX file against the same model served by
    modelsvc passes."""
    export_line, build_line, serve_line, compare_line = _blocks("bash")[4].strip().splitlines()
    venv = str(ROOT / ".venv")

    def run(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line.replace(".venv", venv)], capture_output=True, text=True, cwd=tmp_path)

    exported = run(export_line)
    assert exported.returncode == 0, exported.stderr
    built = run(build_line)
    if importlib.util.find_spec("tensorrt") is None:
        assert built.returncode == 2, built.stderr
        assert "pip install 'modelsvc[tensorrt]'" in built.stderr
        assert not (tmp_path / "plans").exists()
    assert serve_line == ".venv/bin/modelsvc serve --model-repository plans"
    with ModelsvcProcess(tmp_path / "onnx_models") as proc:
        compared = run(compare_line.replace("localhost:8000", proc.url))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "sentence_embedding" in compared.stdout


def test_readme_plan_commands(tmp_path):
    """The planning block as written, in a scratch folder: both example plans, their tables with every $/hour figure
    and break-even point the README quotes, the picture and a values file per pair."""
    (block,) = [b for b in _blocks("bash") if "logicd plan" in b]
    venv = str(ROOT / ".venv")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block.replace(".venv", venv)], capture_output=True,
                         text=True, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "cheapest at peak: split-packed (" in out.stdout
    assert "cheapest at peak: split-packed@inferentia (" in out.stdout
    section = README[README.index("## Capacity and cost planning") :]
    figures = re.findall(r"(?<!at )\$[0-9]+\.[0-9]{2}/hour", section)  # not the prices ("at $0.22/hour")
    assert len(figures) == 7  # before, the naive move, split and packed; Inferentia, T4 twice, CPUs alone
    for figure in figures:
        assert figure.replace("/hour", "") in out.stdout, figure
    points = re.findall(r"(?:above|down to) ([0-9.]+) documents/s", section)
    assert len(points) == 2  # where the T4 pays, how far Inferentia's throughput may fall
    for point in points:
        assert re.search(rf"(above|down to) {re.escape(point)} document/s per pod", out.stdout), point
    assert (tmp_path / "plan.svg").read_text().startswith("<svg")
    assert len(list((tmp_path / "values").glob("*.yaml"))) == 6


#: every fenced block of README.md, by language, and the test that runs it (or checks it, for the two set-up
#: commands: CI runs the second as .ci/run, and services/doc_classifier/tests runs the first one's last steps)
COVERED = {
    "bash": [
        "test_readme_opens_with_the_two_commands (the main command; test_doc_classifier_e2e runs `logicd up`)",
        "test_readme_opens_with_the_two_commands (the test command, which .ci/run runs)",
        "the quickstart fixture (`modelsvc serve` on the quickstart repository)",
        "test_readme_curl_examples",
        "test_readme_gpu_commands (and loadtests/gpu/verify.sh on a GPU machine)",
        "test_readme_plan_commands",
    ],
    "python": [
        "test_readme_python_examples[tritonclient]",
        "test_readme_python_examples[client]",
        "test_readme_logicd_example_defines_a_service",
        "tests/logicd/test_logicd_stream.py::test_the_readme_example_defines_its_routes",
    ],
    "protobuf": ["tests/scheduler/test_padding_batching.py::test_the_readme_example_is_a_padding_config_for_minilm"],
    "yaml": ["test_readme_replicas_yaml_is_valid_model_service_settings"],
}


def test_readme_replicas_yaml_is_valid_model_service_settings():
    """The README's model_service examples (a list of replicas; one name with DNS discovery) are valid settings."""
    import msgspec
    import yaml

    from logicd import ModelServiceConfig

    block = re.search(r"^```yaml\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    parts = [yaml.safe_load(text)["model_service"] for text in block.group(1).split("# or\n")]
    configs = [msgspec.convert(part, ModelServiceConfig) for part in parts]
    assert [c.urls for c in configs] == [
        ["http://10.0.0.5:8000", "http://10.0.0.6:8000"],
        ["http://doc-classifier-model-headless:8000"],
    ]
    assert [c.discovery for c in configs] == ["none", "dns"]


def test_every_command_block_is_covered():
    """A block added to the README without a test here fails: each block is either run above or named in COVERED."""
    fences = re.findall(r"^```(\S*)$", README, flags=re.MULTILINE)
    languages = fences[0::2]  # opening fences; closing ones are bare
    assert all(closing == "" for closing in fences[1::2]), "an unclosed or nested fence in README.md"
    found = {language: languages.count(language) for language in set(languages)}
    assert found == {language: len(tests) for language, tests in COVERED.items()}
