"""Start real modelsvc and logicd processes on free ports and wait until they are ready, loudly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from loadtests.harness._servers import die_with_parent, free_port

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


class ServerProcess:
    """A server in a child process, its output in a log file; ``wait_ready`` polls ``ready_url`` for a 200."""

    ready_path = "/"

    def __init__(self) -> None:
        self.http_port = free_port()
        self.url = f"127.0.0.1:{self.http_port}"
        self.base = f"http://{self.url}"
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix=f"{type(self).__name__.lower()}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    @property
    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, preexec_fn=die_with_parent
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0, path: str | None = None) -> Self:
        """Until GET ``path`` (default: the server's readiness path; e.g. /v2/health/live for a server some of whose
        models fail to load) answers 200; RuntimeError with the log if the process exits or time runs out."""
        assert self.proc is not None
        name = type(self).__name__
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode} before ready:\n{self.log()}")
            try:
                if httpx.get(f"{self.base}{path or self.ready_path}", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready after {timeout}s:\n{self.log()}")

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

    def __enter__(self) -> Self:
        self.start().wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


class ModelsvcProcess(ServerProcess):
    """``modelsvc serve`` in a child process; ``url`` and ``metrics_url`` once started."""

    ready_path = "/v2/health/ready"

    def __init__(self, repository: Path, *extra: str) -> None:
        super().__init__()
        self.repository = repository
        self.extra = extra
        self.metrics_port = free_port()
        self.grpc_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"

    def model_stats(self, model: str) -> dict[str, Any]:
        """The statistics of ``model`` (its first version listed), read over HTTP."""
        body = httpx.get(f"{self.base}/v2/models/{model}/stats", timeout=10).json()
        result: dict[str, Any] = body["model_stats"][0]
        return result

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
            # one process, whatever the machine (--workers auto starts ingest workers above 2 CPUs): tests of the
            # workers ask for them
            *(() if "--workers" in self.extra else ("--workers", "0")),
            *self.extra,
        ]


class LogicdProcess(ServerProcess):
    """``logicd serve SERVICE`` in a child process against the model service at ``model_url``."""

    ready_path = "/health/ready"

    def __init__(self, service: Path, model_url: str, *extra: str) -> None:
        super().__init__()
        self.service = service
        self.model_url = model_url
        self.extra = extra

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "logicd",
            "serve",
            str(self.service),
            *("--host", "127.0.0.1", "--port", str(self.http_port), "--model-url", self.model_url),
            *self.extra,
        ]


def gone(pid: int) -> bool:
    """Whether no process (or only a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


class Up:
    """``logicd up`` in a child process, its output in a file that the test reads as it grows."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.log_path = tmp_path / "up.out"
        self.err_path = tmp_path / "up.err"
        with self.log_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "logicd", "up", *args],
                stdout=out,
                stderr=err,
                cwd=ROOT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def errors(self) -> str:
        return self.err_path.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        return {
            name: int(pid)
            for name, pid in re.findall(r"started the (model service|logic server), pid (\d+)", self.output())
        }

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output(), re.MULTILINE)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"no {pattern!r} in up's output (exit {self.proc.poll()}):\n{self.output()}\nstderr:\n{self.errors()}"
        )

    def wait(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids().values():  # never leave a server behind, whatever the test found
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def wait_for(check: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll ``check`` until it gives something true; fail loudly after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
