"""Start real modelsvc processes on free ports and wait until they are ready, loudly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _die_with_parent() -> None:
    """In the child, before exec: be sent SIGTERM when the test process dies, even if killed, so an
    interrupted test run leaves no server behind (Linux; elsewhere teardown alone stops servers)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModelsvcProcess:
    """``modelsvc serve`` in a child process; ``url`` and ``metrics_url`` once started."""

    def __init__(self, repository: Path, *extra: str) -> None:
        self.repository = repository
        self.extra = extra
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.grpc_port = free_port()
        self.url = f"127.0.0.1:{self.http_port}"
        self.base = f"http://{self.url}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix="modelsvc-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "modelsvc",
            "serve",
            "--model-repository",
            str(self.repository),
            "--http-address",
            "127.0.0.1",
            "--metrics-address",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
            "--grpc-port",
            str(self.grpc_port),
            *self.extra,
        ]

    def start(self) -> ModelsvcProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, preexec_fn=_die_with_parent
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> ModelsvcProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"modelsvc exited with {self.proc.returncode} before ready:\n{self.log()}")
            try:
                if httpx.get(f"{self.base}/v2/health/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"modelsvc not ready after {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ModelsvcProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.terminate()
