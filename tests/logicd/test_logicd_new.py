"""``logicd new``: every template writes a service whose own tests pass as written; names and folders are checked.

The generated services are written into temporary folders by the real command line and their tests run there with
plain ``python -m pytest``, in a process of their own, as a user would run them. The text templates share one
exported model through MODEL_BUILD_CACHE, seeded with the example services' model when that is built.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from logicd import ServiceConfig, load_config
from logicd._cli import main
from logicd._config import NAME_RULE
from logicd._new import TEMPLATES, name_error
from tests._server import ROOT, Up, free_port
from tests.deploy.test_helm_chart import helm  # noqa: F401  (a session fixture)

CACHE_NAME = "all-MiniLM-L6-v2.mean.optimized.onnx"
SERVICES = ("doc_classifier", "embedder")
BUILT_MODELS = [ROOT / "services" / s / "model_repository" / "minilm" / "1" / "model.onnx" for s in SERVICES]
CHART = ROOT / "helm" / "ml-service"
EXPECTED = {
    ".copier-answers.yml",
    ".gitignore",
    "README.md",
    "build_model.py",
    "deploy/build-args.env",
    "deploy/values.yaml",
    "example.json",
    "loadtest/locustfile.py",
    "pytest.ini",
    "ruff.toml",
    "service.yaml",
    "tests/conftest.py",
}


def service_name(template: str) -> str:
    return f"my-{template}"


def files_of(template: str) -> set[str]:
    module = service_name(template).replace("-", "_")
    model = "scorer" if template == "blank" else "minilm"
    return EXPECTED | {
        f"{module}.py",
        f"model_repository/{model}/config.pbtxt",
        f"tests/test_{module}_unit.py",
        f"tests/test_{module}_e2e.py",
        f"tests/test_{module}_deploy.py",
    }


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would steer a nested pytest or a logic server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOGICD_", "COPIER_"))}
    return {**env, **extra}


def new(*args: str, cwd: Path, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logicd", "new", *args],
        cwd=cwd,
        env=clean_env(),
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def new_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``logicd new`` through the command line's own entry point, in this process: its exit status and stderr."""
    try:
        code = main(["new", *args])
    except SystemExit as exc:  # argparse's refusals
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def config_of(folder: Path) -> ServiceConfig:
    """The service's config as load_config reads it; the tokenizer, a build output, need not be there yet."""
    has_tokenizer = "tokenizer" in yaml.safe_load((folder / "service.yaml").read_text())
    env = {"LOGICD_TOKENIZER__PATH": "."} if has_tokenizer else {}
    return load_config(folder / "service.yaml", env)


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One service of each template, written with --no-input (the commands run at the same time)."""
    out = tmp_path_factory.mktemp("new")
    folders = {}

    def write(template: str) -> subprocess.CompletedProcess[str]:
        return new(service_name(template), "--template", template, "--no-input", "-o", str(out), cwd=out)

    with ThreadPoolExecutor(len(TEMPLATES)) as pool:
        runs = dict(zip(TEMPLATES, pool.map(write, TEMPLATES), strict=True))
    for template, done in runs.items():
        assert done.returncode == 0, done.stderr
        assert f"wrote the {template} service" in done.stdout
        folders[template] = out / service_name(template)
    return folders


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MODEL_BUILD_CACHE for the generated services, holding the example services' model when it is built."""
    cache = tmp_path_factory.mktemp("model-cache")
    built = next((m for m in BUILT_MODELS if m.is_file()), None)
    if built is not None:
        shutil.copyfile(built, cache / CACHE_NAME)
    return cache


# --- what each template writes --------------------------------------------------------------------------


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_each_template_writes_a_complete_service(generated, template):
    folder = generated[template]
    assert set(tree(folder)) == files_of(template)
    for path, content in tree(folder).items():
        assert not path.endswith(".jinja")
        assert b"{{" not in content, f"{path} holds unrendered Jinja"
        assert b"{%" not in content, f"{path} holds unrendered Jinja"
    config = config_of(folder)
    assert config.name == service_name(template)
    assert config.service == f"{service_name(template).replace('-', '_')}:service"
    assert config.server.port == 8080
    assert (folder / "model_repository" / config.models[0].name / "config.pbtxt").is_file()
    path = folder / "loadtest" / "locustfile.py"
    compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_the_text_classifier_has_labels_with_descriptions_and_an_example_that_fits_them(generated):
    folder = generated["text-classifier"]
    config = config_of(folder)
    assert len(config.labels) >= 2
    assert all(description.strip() for description in config.labels.values())
    example = yaml.safe_load((folder / "example.json").read_text())
    assert example["top_k"] <= len(config.labels)
    assert (config.chunking.max_tokens, config.tokenizer is not None) == (512, True)


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_the_helm_values_carry_the_service(generated, template):
    folder = generated[template]
    values = yaml.safe_load((folder / "deploy" / "values.yaml").read_text())
    name = service_name(template)
    assert values["fullnameOverride"] == name
    assert values["logic"]["image"]["repository"] == f"{name}-logic"
    assert values["modelRepository"]["source"] == "image"
    assert values["modelRepository"]["image"]["repository"] == f"{name}-models"
    assert values["model"]["modelsvc"]["image"]["repository"] == "modelsvc"
    assert values["logic"]["serviceYaml"] == (folder / "service.yaml").read_text()  # the ConfigMap's content
    timeout = config_of(folder).model_service.timeout_s
    assert values["logic"]["drain"]["exitTimeoutSeconds"] >= timeout


def leaves(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict) and tree:
        return [leaf for key, value in tree.items() for leaf in leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


@pytest.mark.skipif(not (CHART / "values.yaml").is_file(), reason="no Helm chart at helm/ml-service")
def test_the_helm_values_set_only_keys_the_chart_has(generated):
    chart = yaml.safe_load((CHART / "values.yaml").read_text())
    known = set(leaves(chart))
    for template, folder in generated.items():
        values = yaml.safe_load((folder / "deploy" / "values.yaml").read_text())
        unknown = [key for key in leaves(values) if key not in known]
        assert unknown == [], f"{template}: keys the chart does not have: {unknown}"


def test_the_chart_renders_the_service_with_its_values(generated, tmp_path, helm):  # noqa: F811 (the fixture)
    """``helm``: tests/deploy/test_helm_chart.py's fixture ($HELM, or the helm it keeps in .tools, installed when
    missing)."""
    home = tmp_path / "helm-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env.update(
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(home / "none"),
    )
    for template, folder in generated.items():
        done = subprocess.run(
            [str(helm), "template", folder.name, str(CHART), "-f", str(folder / "deploy" / "values.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert done.returncode == 0, f"{template}: {done.stderr}"
        objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(done.stdout) if o}
        name = service_name(template)
        config_map = objects[("ConfigMap", f"{name}-logic")]
        assert config_map["data"]["service.yaml"] == (folder / "service.yaml").read_text()
        images = set()
        for (kind, _), obj in objects.items():
            if kind == "Deployment":
                pod = obj["spec"]["template"]["spec"]
                images |= {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
        assert f"registry.example.com/{name}-logic:0.1.0" in images
        assert f"registry.example.com/{name}-models:0.1.0" in images


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_the_build_arguments_are_the_dockerfiles(generated, template):
    env = (generated[template] / "deploy" / "build-args.env").read_text()
    args = dict(re.findall(r"^([A-Z_]+)=(.*)$", env, re.M))
    name = service_name(template)
    assert args == {"SERVICE_DIR": f"services/{name}", "MODEL_REPOSITORY": f"services/{name}/model_repository"}
    dockerfiles = {
        "SERVICE_DIR": ROOT / "docker" / "logic.Dockerfile",
        "MODEL_REPOSITORY": ROOT / "docker" / "model-repository.Dockerfile",
    }
    for arg, dockerfile in dockerfiles.items():
        if dockerfile.is_file():
            assert re.search(rf"^ARG {arg}\b", dockerfile.read_text(), re.M), f"{dockerfile.name} takes no {arg}"
    if all(d.is_file() for d in dockerfiles.values()):  # the optional ones, shown commented out, exist too
        declared = "".join(d.read_text() for d in dockerfiles.values())
        for arg in re.findall(r"^# ([A-Z_]+)=", env, re.M):
            assert re.search(rf"^ARG {arg}\b", declared, re.M), f"no Dockerfile takes {arg}"


def test_a_service_inside_the_repository_builds_from_its_own_folder(tmp_path):
    """Written inside the repository (whose docker/ builds the images), SERVICE_DIR is the folder's real path."""
    fake_root = tmp_path / "repo"
    (fake_root / "docker").mkdir(parents=True)
    (fake_root / "docker" / "logic.Dockerfile").write_text("ARG SERVICE_DIR\n")
    done = new("inside", "-t", "blank", "--no-input", "-o", "teams/a", cwd=fake_root)
    assert done.returncode == 0, done.stderr
    env = (fake_root / "teams" / "a" / "inside" / "deploy" / "build-args.env").read_text()
    assert "SERVICE_DIR=teams/a/inside\n" in env
    values = (fake_root / "teams" / "a" / "inside" / "deploy" / "values.yaml").read_text()
    assert "--set-file logic.serviceYaml=teams/a/inside/service.yaml" in values


@pytest.mark.skipif(not (Path(sys.executable).parent / "ruff").is_file(), reason="ruff is not installed")
def test_the_generated_code_passes_the_projects_lint_and_format(generated, tmp_path):
    """With the project's ruff settings, for the default services and for names of the longest kind (63 characters)."""
    longest = "x" * 55 + "-service"
    folders = [str(f) for f in generated.values()]
    for template in TEMPLATES:
        out = tmp_path / template
        done = new(longest, "-t", template, "--no-input", "-o", str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        folders.append(str(out / longest))
    ruff = str(Path(sys.executable).parent / "ruff")
    for command in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [ruff, *command, "--config", "pyproject.toml", *folders],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


# --- the generated tests pass as written ----------------------------------------------------------------


@pytest.fixture(scope="module")
def generated_runs(generated, model_cache) -> dict[str, subprocess.CompletedProcess[str]]:
    """`python -m pytest` in each new folder, at the same time (the suite leaves the second core idle): it builds
    the model (copied from the shared cache when there) and runs the service's in-process and end-to-end tests.
    With the cache still empty, the second text template waits for the first, which fills it."""

    def run(template: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=generated[template],
            env=clean_env(MODEL_BUILD_CACHE=str(model_cache)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=850,
            check=False,
        )

    def run_in_turn(templates: list[str]) -> dict[str, subprocess.CompletedProcess[str]]:
        return {template: run(template) for template in templates}

    text = [t for t in TEMPLATES if t != "blank"]
    groups = [[t] for t in TEMPLATES] if (model_cache / CACHE_NAME).is_file() else [["blank"], text]
    with ThreadPoolExecutor(len(groups)) as pool:
        return {t: done for ran in pool.map(run_in_turn, groups) for t, done in ran.items()}


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("template", list(TEMPLATES))
def test_the_generated_tests_pass_right_after_generation(generated, up_session, generated_runs, model_cache, template):
    """Each new service's own tests pass as written (run by ``generated_runs``)."""
    folder = generated[template]
    done = generated_runs[template]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"^\d+ passed in ", summary), summary  # nothing failed, skipped or errored
    model = "scorer" if template == "blank" else "minilm"
    assert (folder / "model_repository" / model / "1" / "model.onnx").is_file()
    if template != "blank":
        assert (model_cache / CACHE_NAME).is_file()  # the next service copies it instead of exporting again


def _up_session(tmp_path: Path) -> None:
    """`logicd new` of a blank service, its build_model.py, then `logicd up`: ready, the example sent and answered."""
    done = new("quick-start", "-t", "blank", "--no-input", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "quick-start"
    build = subprocess.run(
        [sys.executable, "build_model.py"], cwd=folder, capture_output=True, text=True, timeout=120, check=False
    )
    assert build.returncode == 0, build.stderr
    port = free_port()
    running = Up(tmp_path, str(folder), "--port", str(port))
    try:
        running.wait_for(r"^logicd up: quick-start is ready$", timeout=120)
        shown = running.wait_for(r"^logicd up: example\.json sent to POST /v1/predict: 200 in \d+ ms$", timeout=60)
        assert '"label": 0' in running.output()[shown.end() :]
        if importlib.util.find_spec("locust") is not None:  # where locust is installed, the load test runs briefly
            scenario = ("-f", "loadtest/locustfile.py", "--host", f"http://127.0.0.1:{port}")
            load = subprocess.run(
                [sys.executable, "-m", "locust", *scenario, "--headless", "-u", "2", "-r", "2", "-t", "3s"],
                cwd=folder,
                env=clean_env(LOADTEST_MAX_P95_MS="5000"),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert load.returncode == 0, load.stdout + load.stderr
        running.proc.send_signal(signal.SIGTERM)
        assert running.wait() == 0, running.output() + running.errors()
    finally:
        running.close()


@pytest.fixture(scope="module")
def up_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[None]]:
    """``_up_session`` started in a thread of its own: the generated services' test runs ask for it first, so it
    runs beside them (mostly waiting on processes); test_logicd_up_serves_... reads its outcome."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_up_session, tmp_path_factory.mktemp("up"))


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_logicd_up_serves_a_new_service_and_sends_its_example(up_session: Future[None]) -> None:
    up_session.result(timeout=280)


# --- names, folders, answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["Support", "1support", "a" * 64, "my_service", "-svc", "svc-", "my.svc", "my svc"],
    ids=["uppercase", "leading-digit", "too-long", "underscore", "leading-dash", "trailing-dash", "dot", "space"],
)
def test_a_name_that_breaks_the_rule_is_refused_with_the_rule(tmp_path, capsys, name):
    # in this process (a refusal needs no interpreter of its own; the command line as a process is run above)
    code, err = new_here(capsys, "--no-input", "-o", str(tmp_path), "--", name)  # `--`: "-svc" is a name
    assert code == 2
    assert NAME_RULE in err
    assert "start with a letter" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("json", "standard library"),
        ("numpy", "installed module"),
        ("tests", "file or folder the service holds"),
        ("class", "Python keyword"),
    ],
)
def test_a_name_whose_module_would_shadow_another_is_refused(tmp_path, capsys, name, why):
    assert main(["new", name, "--no-input", "-o", str(tmp_path)]) == 2
    assert why in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_good_names_pass_the_check():
    for name in ("a", "svc", "doc-classifier", "a1-b2", "x" * 63):
        assert name_error(name) is None, name


def test_an_existing_folder_is_kept_without_force_and_written_over_with_it(tmp_path, capsys):
    assert new("svc", "-t", "blank", "--no-input", cwd=tmp_path).returncode == 0
    folder = tmp_path / "svc"
    pristine = (folder / "service.yaml").read_text()
    (folder / "service.yaml").write_text(pristine + "# edited\n")
    (folder / "notes.txt").write_text("mine")
    built = folder / "model_repository" / "scorer" / "1" / "model.onnx"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"a built model")
    before = tree(folder)

    code, err = new_here(capsys, "svc", "-t", "blank", "--no-input", "-o", str(tmp_path))  # a refusal: in-process
    assert code == 2
    assert "exists" in err
    assert "--force" in err
    assert tree(folder) == before  # nothing touched

    done = new("svc", "-t", "blank", "--no-input", "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "  service.yaml  (replaced)" in done.stdout  # what --force replaced is listed
    assert "notes.txt" not in done.stdout  # what it keeps is not
    assert (folder / "service.yaml").read_text() == pristine  # the template's files are written again
    assert (folder / "notes.txt").read_text() == "mine"  # anything else is kept
    assert built.read_bytes() == b"a built model"


def test_an_empty_folder_is_filled_and_a_file_in_the_way_is_refused_even_with_force(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert new("empty", "-t", "blank", "--no-input", cwd=tmp_path).returncode == 0
    assert (tmp_path / "empty" / "service.yaml").is_file()
    (tmp_path / "afile").write_text("x")
    code, err = new_here(capsys, "afile", "-t", "blank", "--no-input", "--force", "-o", str(tmp_path))  # in-process
    assert code == 2
    assert "not a folder" in err
    assert (tmp_path / "afile").read_text() == "x"


def test_answers_from_the_command_line(tmp_path):
    done = new("svc", "-t", "blank", "--no-input", "-d", "port=9123", "-d", "route=/v2/score", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = load_config(tmp_path / "svc" / "service.yaml", {})
    assert config.server.port == 9123
    assert '@service.post("/v2/score")' in (tmp_path / "svc" / "svc.py").read_text()
    assert 'ROUTE = "/v2/score"' in (tmp_path / "svc" / "loadtest" / "locustfile.py").read_text()


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("port=70000", "port number"),
        ("port=eighty", "port"),
        ("route=no-slash", "path"),
        ("route=/metrics", "taken"),
        ("description=a\\b", "backslash"),
        ("name=other", "NAME"),
        ("portless", "KEY=VALUE"),
    ],
)
def test_a_bad_answer_is_refused_and_nothing_is_left(tmp_path, capsys, answer, says):
    code, err = new_here(capsys, "svc", "-t", "blank", "--no-input", "-d", answer, "-o", str(tmp_path))
    assert code == 2, err
    assert says in err
    assert not (tmp_path / "svc").exists()
    assert list(tmp_path.iterdir()) == []


def test_without_a_terminal_the_defaults_are_taken(tmp_path):
    """No --no-input, but stdin is not a terminal: nothing is asked, nothing hangs."""
    done = new("svc", "-t", "embedder", cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load((tmp_path / "svc" / "service.yaml").read_text())["server"]["port"] == 8080


def test_help_lists_the_templates_and_the_rule(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["new", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for template in TEMPLATES:
        assert template in out
    assert "DNS-1123" in out
