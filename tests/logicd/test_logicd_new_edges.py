"""Regression tests from the review of `logicd new`: names that shadow packages or sibling services, answers to
skipped questions, custom labels, the answers file, -o through a file, mypy on generated code. Each failed before
its fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logicd._cli import main
from logicd._new import NewError, name_error, new_service
from tests._mypy import copy_of_the_projects_mypy_cache
from tests._server import ROOT

CACHE_NAME = "all-MiniLM-L6-v2.mean.optimized.onnx"
SERVICES = ("doc_classifier", "embedder")
BUILT_MODELS = [ROOT / "services" / s / "model_repository" / "minilm" / "1" / "model.onnx" for s in SERVICES]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOGICD_", "COPIER_"))}
    return {**env, **extra}


@pytest.mark.parametrize("name", ["logicd", "modelsvc"])
def test_the_frameworks_own_packages_cannot_name_a_service(name):
    """With the project installed editable (pip install -e ., as in this venv), PathFinder does not see logicd or
    modelsvc, so `logicd new logicd` writes logicd/logicd.py, which shadows the framework: its tests fail with a
    circular import, and `python -m logicd` run next to it runs the wrong package."""
    assert name_error(name) is not None


def test_an_embedder_answer_to_route_is_refused_or_honoured(tmp_path):
    """`-d route=...` with --template embedder: the route question is skipped (when: false) but the answer is still
    used by the tests and the locustfile, while the logic module hard-codes /v1/embeddings; 13 generated tests fail."""
    try:
        folder = new_service("emb-r", template="embedder", output_dir=tmp_path, data={"route": "/v2/x"})
    except NewError:
        return  # refused: fine
    module = (folder / "emb_r.py").read_text()
    tests = (folder / "tests" / "test_emb_r_unit.py").read_text()
    route_in_tests = re.search(r'^ROUTE = "(.*)"$', tests, re.M)
    assert route_in_tests is not None
    assert f'@service.post("{route_in_tests.group(1)}")' in module


def test_the_answers_are_recorded_for_copier_update(tmp_path):
    """No .copier-answers.yml is written (no {{ _copier_conf.answers_file }}.jinja in the template), so the answers
    are lost and `copier update` in a generated service fails ("Template not found")."""
    folder = new_service("answered", template="blank", output_dir=tmp_path)
    assert (folder / ".copier-answers.yml").is_file()


def test_a_file_where_the_output_folder_should_be_is_a_usage_error(tmp_path, capsys):
    """-o pointing at a file: Copier fails half-way (exit 1, a CleanupWarning, NotADirectoryError) instead of the
    documented exit status 2 for 'a folder in the way'."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    status = main(["new", "svc", "-t", "blank", "--no-input", "-o", str(blocker)])
    assert status == 2, capsys.readouterr().err


def test_a_logic_module_already_used_by_a_sibling_service_is_refused(tmp_path):
    """Generating `classifier` next to services/doc_classifier (whose module is classifier.py) is accepted; run from
    the repository root in one pytest process, load_service's import_module returns the cached sibling module and the
    new service's tests error (reproduced: pytest services/doc_classifier services/classifier). The same for a
    service named `services` inside the repository (the project's services package)."""
    sibling = tmp_path / "doc_classifier"
    sibling.mkdir()
    (sibling / "service.yaml").write_text("name: doc-classifier\nservice: classifier:service\nmodels: [minilm]\n")
    (sibling / "classifier.py").write_text("service = None\n")
    with pytest.raises(NewError):
        new_service("classifier", template="blank", output_dir=tmp_path)


@pytest.mark.skipif(shutil.which("mypy", path=str(Path(sys.executable).parent)) is None, reason="no mypy")
@pytest.mark.timeout(300)
def test_the_generated_embedder_module_passes_the_projects_mypy(tmp_path):
    """The project runs mypy --strict; the embedder's encode_vector(vector: np.ndarray, ...) is a type-arg error."""
    folder = new_service("typed-emb", template="embedder", output_dir=tmp_path)
    cache = copy_of_the_projects_mypy_cache(tmp_path / "mypy_cache")
    done = subprocess.run(
        [
            *(str(Path(sys.executable).parent / "mypy"), "--config-file", str(ROOT / "pyproject.toml")),
            *("--cache-dir", str(cache), "typed_emb.py"),
        ],
        cwd=folder,
        env=clean_env(MYPYPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_custom_labels_with_short_descriptions_still_pass_the_generated_tests(tmp_path):
    """`-d labels=...` is a supported answer, but test_a_long_document_is_cut_into_512_token_windows repeats the
    first description 150 times and asserts > 1000 tokens: a description under ~7 tokens fails it right after
    generation ("assert 450 > 1000")."""
    cache = tmp_path / "cache"
    cache.mkdir()
    built = next((m for m in BUILT_MODELS if m.is_file()), None)
    if built is not None:
        shutil.copyfile(built, cache / CACHE_NAME)
    folder = new_service(
        "spam-filter",
        template="text-classifier",
        output_dir=tmp_path,
        data={"labels": "{spam: Unwanted advertising., ham: A normal personal message.}"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not integration"],
        cwd=folder,
        env=clean_env(MODEL_BUILD_CACHE=str(cache)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
