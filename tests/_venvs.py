"""Tools that must not share the project's environment (their pins clash with tritonclient's), each installed
once into its own virtual environment at the repository root: MLServer (protobuf, numpy 2) and locust
(geventhttpclient >= 2.5 where tritonclient[http] 2.51 wants <= 2.0.2).

``ensure_venv(venv, requirements, executable)`` builds the environment when it is missing or was built for other
requirements, under a file lock so that concurrent test runs build it once, and returns the executable's path.
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

from loadtests._servers import marker_of

INTEROP_ENV = "MODELSVC_INTEROP"
"""Set to 1 (CI does) to fail instead of skipping when the package registry cannot be reached."""

# pip's words for "the index could not be reached" (as opposed to a broken requirement or a build failure)
_UNREACHABLE = re.compile(
    r"No matching distribution found|Could not fetch URL|NewConnectionError|Failed to establish a new connection"
    r"|Max retries exceeded|Temporary failure in name resolution|Name or service not known|ConnectTimeout"
    r"|Network is unreachable|ProxyError|SSLError",
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
    created = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if created.returncode != 0:
        pytest.fail(f"python -m venv {venv} failed:\n{created.stdout}{created.stderr}", pytrace=False)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        output = "\n".join(line for line in (pip.stdout + pip.stderr).splitlines() if "is ignored" not in line)
        shutil.rmtree(venv, ignore_errors=True)
        if _UNREACHABLE.search(output):
            wanted_text = " ".join(requirements)
            unavailable(f"could not install {wanted_text}: the package index is unreachable\n{output[-3000:]}")
        pytest.fail(f"pip install {' '.join(requirements)} failed:\n{output[-3000:]}", pytrace=False)
    marker.write_text(wanted)
    print(f"created {venv} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tool
