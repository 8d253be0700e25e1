"""Tools that must not share the project's environment (their pins clash with tritonclient's), each installed
once into its own virtual environment at the repository root: MLServer (protobuf, numpy 2) and locust
(geventhttpclient >= 2.5 where tritonclient[http] 2.51 wants <= 2.0.2).

``ensure_venv(venv, requirements, executable)`` builds the environment when it is missing or was built for other
requirements, under a file lock so that concurrent test runs build it once, and returns the executable's path.
It installs with uv (``uv pip install``): pip spent most of a minute resolving MLServer's 67 packages against
PyPI's large index pages, uv takes seconds. uv is the one on PATH, in the project's environment or in another tool's,
else pip installs it into the new environment first; where uv cannot be had, pip installs the requirements.
A package index that cannot be reached skips the test, or fails it under ``MODELSVC_INTEROP=1`` (CI).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadtests.harness._servers import marker_of

INTEROP_ENV = "MODELSVC_INTEROP"
"""Set to 1 (CI does) to fail instead of skipping when the package registry cannot be reached."""

# pip's words for "the index could not be reached" (as opposed to a broken requirement or a build failure)
_UNREACHABLE = re.compile(
    r"No matching distribution found|Could not fetch URL|NewConnectionError|Failed to establish a new connection"
    r"|Max retries exceeded|Temporary failure in name resolution|Name or service not known|ConnectTimeout"
    r"|Network is unreachable|ProxyError|SSLError"
    # uv's
    r"|Failed to fetch|error sending request|dns error|Connection refused",
)


def unavailable(message: str) -> None:
    """Fail under ``MODELSVC_INTEROP=1`` (CI), skip elsewhere."""
    if os.environ.get(INTEROP_ENV) == "1":
        pytest.fail(f"{message}\n({INTEROP_ENV}=1: these tests must run)", pytrace=False)
    pytest.skip(f"{message} (set {INTEROP_ENV}=1 to fail instead)")


def ensure_venv(venv: Path, requirements: Sequence[str], executable: str) -> Path:
    """``venv/bin/<executable>``, building ``venv`` with ``requirements`` when it is missing or stale."""
    lock_path = Path(tempfile.gettempdir()) / f"modelsvc-{venv.name.lstrip('.')}.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _ensure_locked(venv, tuple(requirements), venv / "bin" / executable)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ensure_locked(venv: Path, requirements: tuple[str, ...], tool: Path) -> Path:
    marker = marker_of(venv)
    wanted = "\n".join(requirements)
    if tool.exists() and marker.exists() and marker.read_text() == wanted:
        return tool
    if venv.exists():  # half-built or built for other requirements
        shutil.rmtree(venv)
    started = time.monotonic()
    # no pip inside: ensurepip costs seconds and the tools never need it (pip, when used, runs with --python)
    created = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    if created.returncode != 0:
        pytest.fail(f"python -m venv {venv} failed:\n{created.stdout}{created.stderr}", pytrace=False)
    python = venv / "bin" / "python"
    uv = _uv(venv)
    if uv is not None:
        argv = [uv, "pip", "install", "--quiet", "--python", str(python), *requirements]
        env = {**os.environ, **_uv_settings()}
    else:
        argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *requirements]
        env = None
    installed = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if installed.returncode != 0:
        _failed(venv, requirements, installed.stdout + installed.stderr)
    marker.write_text(wanted)
    how = "uv" if uv is not None else "pip"
    print(f"created {venv} with {how} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tool


def _uv(venv: Path) -> str | None:
    """uv on PATH, beside the project's Python or in another tool's environment (``.venv-*``); else installed by pip
    into ``venv`` (about 5 s, one wheel). None where pip cannot install it for a reason other than an unreachable
    index (pip then installs the tools)."""
    siblings = sorted(str(p) for p in venv.parent.glob(".venv-*/bin/uv") if not p.is_relative_to(venv))
    for found in (shutil.which("uv"), str(Path(sys.executable).parent / "uv"), *siblings):
        if found and os.access(found, os.X_OK):
            return found
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "uv"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if pip.returncode != 0:
        output = pip.stdout + pip.stderr
        if _UNREACHABLE.search(output):
            _failed(venv, ("uv",), output)
        return None
    return str(venv / "bin" / "uv")


def _uv_settings() -> dict[str, str]:
    """pip's index settings for uv, which reads its own (``UV_INDEX_URL``, ``UV_EXTRA_INDEX_URL``) and not pip's."""
    settings = {"UV_LINK_MODE": "copy"}  # no hardlink warning when uv's cache is on another filesystem
    for pip_name, uv_name in (("PIP_INDEX_URL", "UV_INDEX_URL"), ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL")):
        if pip_name in os.environ and uv_name not in os.environ:
            settings[uv_name] = os.environ[pip_name]
    return settings


def _failed(venv: Path, requirements: Sequence[str], output: str) -> None:
    """The environment removed; a skip (or a CI failure) when the index is unreachable, else a failure."""
    output = "\n".join(line for line in output.splitlines() if "is ignored" not in line)
    shutil.rmtree(venv, ignore_errors=True)
    wanted_text = " ".join(requirements)
    if _UNREACHABLE.search(output):
        unavailable(f"could not install {wanted_text}: the package index is unreachable\n{output[-3000:]}")
    pytest.fail(f"installing {wanted_text} into {venv} failed:\n{output[-3000:]}", pytrace=False)
