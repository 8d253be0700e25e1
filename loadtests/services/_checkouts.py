"""The two checkouts that bench_services compares, and an example service's pair started from one of them.

A checkout is a folder holding this repository at some revision: the current working tree (``_servers.ROOT``, with
whatever is uncommitted in it) or a base made with ``git worktree add --detach`` (removed again at the end, also
when the run fails or is interrupted). The built models and tokenizers are git-ignored, so a fresh worktree has
none: they are hard-linked (copied across file systems) from the current checkout into it.

Each side's servers run that checkout's code: ``python -m modelsvc serve`` and ``python -m logicd serve`` with the
checkout as working directory and first on PYTHONPATH (the venv's editable install, a finder that comes after
PYTHONPATH, points at the main checkout); ``provenance`` asks the same interpreter, with the same environment,
which files ``modelsvc`` and ``logicd`` are imported from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadtests.harness import _servers

BUILT_PATTERNS = (
    "services/*/model_repository/*/1/model.onnx",
    "services/*/model_repository/*/config.pbtxt",
    "services/*/tokenizer/*",
)
"""What ``python -m services.build`` writes (git-ignored): the example services' models (ONNX Runtime's, which both
sides serve), their configs (built from ``minilm.config.pbtxt`` since it left the model repository; a base older
than that has its config tracked, and keeps it) and tokenizers."""

DEFAULT_BASE = "b3a05f9"
"""The commit before issue 16's data-plane work."""


@dataclass(frozen=True)
class Checkout:
    """One side of the comparison: ``label`` (base or current) and the folder its code is run from."""

    label: str
    root: Path
    description: str
    """Which revision the folder holds, for the report (e.g. ``b3a05f9 (worktree)``)."""

    def env(self) -> dict[str, str]:
        """The environment its servers run with: the checkout first on PYTHONPATH."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")]).strip(os.pathsep)
        return env


def git(*args: str, cwd: Path = _servers.ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def describe(root: Path) -> str:
    """``<short hash>`` of the folder's HEAD, plus a note when its tracked files have uncommitted changes."""
    head = git("rev-parse", "--short", "HEAD", cwd=root)
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=root)
    return f"{head} + uncommitted changes" if dirty else head


def missing_built(root: Path) -> list[str]:
    """The services whose model is not built for ONNX Runtime in ``root`` (empty when doc_classifier and embedder
    both are; ``services.build``'s auto builds the classifier for OpenVINO on a CPU with native bf16)."""
    return [
        svc
        for svc in ("doc_classifier", "embedder")
        if not (root / "services" / svc / "model_repository" / "minilm" / "1" / "model.onnx").exists()
    ]


def link_built(source: Path, target: Path) -> int:
    """Hard-link (or copy, across file systems) the built models and tokenizers of ``source`` into ``target``
    where ``target`` has none; returns how many files were placed."""
    placed = 0
    for pattern in BUILT_PATTERNS:
        for path in sorted(source.glob(pattern)):
            dest = target / path.relative_to(source)
            if dest.exists() or not path.is_file():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
            placed += 1
    return placed


@contextmanager
def base_worktree(rev: str) -> Iterator[Checkout]:
    """A detached worktree of this repository at ``rev`` in a temporary folder, with the built models linked in;
    removed (and pruned from git's list) on the way out, whatever happened."""
    parent = Path(tempfile.mkdtemp(prefix="bench_services-"))
    folder = parent / "base"
    added = False
    try:
        print(f"  git worktree add --detach {folder} {rev}", flush=True)
        git("worktree", "add", "--detach", str(folder), rev)
        added = True
        link_built(_servers.ROOT, folder)
        yield Checkout("base", folder, f"{git('rev-parse', '--short', 'HEAD', cwd=folder)} (worktree of {rev})")
    finally:
        if added:
            subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=_servers.ROOT,
                           capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=_servers.ROOT, capture_output=True, check=False)


def given_base(folder: Path) -> Checkout:
    """``--base-dir``: a checkout made by the user; the models it lacks are linked in from the current one."""
    root = folder.resolve()
    if not (root / "modelsvc").is_dir() or not (root / "logicd").is_dir():
        raise SystemExit(f"--base-dir {folder}: not a checkout of this repository (no modelsvc/ and logicd/)")
    link_built(_servers.ROOT, root)
    return Checkout("base", root, f"{describe(root)} ({root})")


def current() -> Checkout:
    return Checkout("current", _servers.ROOT, f"{describe(_servers.ROOT)} ({_servers.ROOT})")


def provenance(checkout: Checkout) -> dict[str, str]:
    """The files ``modelsvc`` and ``logicd`` are imported from with this checkout's environment and working folder
    (what its servers import); fails when either comes from elsewhere."""
    code = "import modelsvc, logicd; print(modelsvc.__file__); print(logicd.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=checkout.root, env=checkout.env(), check=True,
                          capture_output=True, text=True)  # fmt: skip
    modelsvc_file, logicd_file = done.stdout.split()
    for name, file in (("modelsvc", modelsvc_file), ("logicd", logicd_file)):
        if not Path(file).resolve().is_relative_to(checkout.root):
            raise RuntimeError(f"{checkout.label}: {name} is imported from {file}, not from {checkout.root}")
    return {"modelsvc": modelsvc_file, "logicd": logicd_file}


def pair_processes(checkout: Checkout, service: str) -> tuple[_servers.ServerProcess, _servers.ServerProcess]:
    """``python -m modelsvc serve`` on the service's model repository and ``python -m logicd serve`` on its folder,
    both from the checkout, on free loopback ports (not started)."""
    http, grpc = _servers.free_port(), _servers.free_port()
    model_argv = [
        sys.executable, "-m", "modelsvc", "serve",
        "--model-repository", f"services/{service}/model_repository",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(_servers.free_port()),
        "--http-address", "127.0.0.1",
    ]  # fmt: skip
    env = checkout.env()
    model = _servers.ServerProcess(f"modelsvc-{checkout.label}-{service}", model_argv, http, env=env,
                                   cwd=checkout.root, grpc_port=grpc, ready_timeout_s=120.0)  # fmt: skip
    port = _servers.free_port()
    logic_argv = [
        sys.executable, "-m", "logicd", "serve", f"services/{service}",
        "--host", "127.0.0.1", "--port", str(port), "--model-url", model.base_url,
    ]  # fmt: skip
    logic = _servers.ServerProcess(f"logicd-{checkout.label}-{service}", logic_argv, port, env=env,
                                   cwd=checkout.root, ready_path="/health/ready", ready_timeout_s=120.0)  # fmt: skip
    return model, logic


def start_pairs(stack: ExitStack, checkouts: list[Checkout], services: list[str]) -> dict[tuple[str, str], str]:
    """Every (checkout, service) pair, the model servers started side by side, then the logic servers; each is
    stopped when ``stack`` closes. Returns (checkout label, service) -> the logic server's base URL."""
    pairs = {(c.label, s): pair_processes(c, s) for c in checkouts for s in services}
    for model, _ in pairs.values():
        stack.enter_context(_Stopping(model))
        model.start()
    for model, _ in pairs.values():
        model.wait_ready()
    for _, logic in pairs.values():
        stack.enter_context(_Stopping(logic))
        logic.start()
    for _, logic in pairs.values():
        logic.wait_ready()
    return {key: logic.base_url for key, (_, logic) in pairs.items()}


class _Stopping:
    """Stops a server on the way out, started or not; removes its log unless an error ends the run (the log of a
    server that did not start is named in the error)."""

    def __init__(self, server: _servers.ServerProcess):
        self.server = server

    def __enter__(self) -> _servers.ServerProcess:
        return self.server

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None or not issubclass(exc_type, Exception):  # a success, Ctrl-C or SIGTERM
            self.server.__exit__(None, None, None)
        else:
            self.server.stop()
