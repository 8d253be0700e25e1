"""A real MLServer, one of the peers the benchmarks and the interop tests run beside modelsvc, from its own virtual
environment so that its dependencies (protobuf, numpy 2, grpcio) never meet the project's pinned ones.

``MLServerProcess`` writes ``settings.json`` (subclasses add their model folders) and starts ``mlserver start`` on
free 127.0.0.1 ports, waiting for ``/v2/health/ready`` and failing loudly with MLServer's log. ``executable()``
finds ``.venv-mlserver/bin/mlserver`` when it was built for ``REQUIREMENTS`` (tests/interop builds it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from loadtests._servers import ROOT, free_port, marker_of

VENV = ROOT / ".venv-mlserver"
REQUIREMENTS = ("mlserver==1.7.1", "uvloop<0.22")
"""MLServer and the uvloop its parallel workers need (see shared/DESIGN.md); pinned, so the env is rebuilt
when this changes."""
READY_TIMEOUT_S = 120.0


def executable() -> Path | None:
    """``.venv-mlserver/bin/mlserver`` when it was built for the current requirements; never builds."""
    exe = VENV / "bin" / "mlserver"
    marker = marker_of(VENV)
    if exe.exists() and marker.exists() and marker.read_text() == "\n".join(REQUIREMENTS):
        return exe
    return None


class MLServerProcess:
    """``mlserver start`` on a folder holding ``settings.json`` and the models that ``write_folder`` adds (none
    here: a subclass writes its model folders after calling it); ``url`` once started."""

    def __init__(self, mlserver: Path, folder: Path) -> None:
        self.mlserver = mlserver
        self.folder = folder
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.url = f"127.0.0.1:{self.http_port}"
        self.base = f"http://{self.url}"
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix="mlserver-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    def write_folder(self) -> None:
        settings = {
            "debug": False,
            "parallel_workers": 0,  # inference in the server process: no worker pool, no uvloop issue
            "host": "127.0.0.1",
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,  # MLServer always opens gRPC; a free port keeps it out of the way
            "metrics_port": self.metrics_port,
            "metrics_endpoint": None,  # no metrics server
            "load_models_at_startup": True,
        }
        (self.folder / "settings.json").write_text(json.dumps(settings, indent=2))

    def start(self) -> MLServerProcess:
        self.write_folder()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSERVER_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(PYTHONUNBUFFERED="1", PATH=f"{self.mlserver.parent}{os.pathsep}{env.get('PATH', '')}")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(self.mlserver), "start", str(self.folder)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.folder,  # MLServer keeps .metrics/ and .envs/ in its working directory
                env=env,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> MLServerProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlserver exited with {self.proc.returncode} before ready:\n{self.log()}")
            try:
                if httpx.get(f"{self.base}/v2/health/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.terminate()
        raise RuntimeError(f"mlserver not ready on {self.base} after {timeout} s:\n{self.log()}")

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> MLServerProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.terminate()
