"""Start and stop the servers under test: modelsvc, a service's pair (modelsvc + logicd), the naive service, and
(optionally) a real Triton from nvidia-pytriton."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

READY_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the example services live in ROOT / "services"."""


_handed_out: set[int] = set()


def die_with_parent() -> None:
    """In the child, before exec: be sent SIGTERM when the process that started it dies, even if killed, so an
    interrupted benchmark or test run leaves no server behind (Linux; elsewhere teardown alone stops servers)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def marker_of(venv: Path) -> Path:
    """The file that records what a tool's own virtual environment (``.venv-mlserver``, ``.venv-locust``) was built
    with: tests/_venvs.py writes it, the benchmarks read it."""
    return venv / ".modelsvc-requirements"


def free_port() -> int:
    """A port free on 127.0.0.1 now, and never one this process handed out before: the socket that found it
    closes at once, so the kernel may offer the same port again (a server then got one port for gRPC and
    for metrics, and could not bind the second)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no port that this process has not handed out already")


def inference_count(base_url: str, model: str) -> int:
    """The model's cumulative inference count (all versions) from GET /v2/models/<m>/stats: modelsvc and Triton."""
    body = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10.0).json()
    return sum(int(s.get("inference_count", 0)) for s in body.get("model_stats", []))


def _tree_pids(root: int) -> list[int]:
    """root and all its descendants (Triton's python backend runs a stub process per model instance)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of one process (all its threads), from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15 of stat)


def tree_cpu_seconds(root: int) -> float:
    """User+system CPU seconds of a process and its live descendants, from /proc."""
    return sum(cpu_seconds(pid) for pid in _tree_pids(root))


class ServerProcess:
    """A server process on free ports; ready when GET ``ready_path`` (/v2/health/ready) answers 200; stopped with
    SIGTERM."""

    grpc_port: int | None = None
    """The gRPC endpoint's port, when the server opens one (``grpc_url``)."""
    metrics_port: int | None = None
    """The metrics endpoint's port, when the server opens one."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        http_port: int,
        env: dict[str, str] | None = None,
        *,
        ready_path: str = "/v2/health/ready",
        ready_timeout_s: float = READY_TIMEOUT_S,
        cwd: Path | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        log: Path | None = None,
    ):
        """``log``: where its output goes, kept after it stops (by default a temporary file, removed when it stops
        and kept when it fails to start)."""
        self.name = name
        if grpc_port is not None:  # (a subclass may have set it before calling this)
            self.grpc_port = grpc_port
        if metrics_port is not None:
            self.metrics_port = metrics_port
        self.argv = list(argv)
        self.http_port = http_port
        self.env = env
        self.ready_path = ready_path
        self.ready_timeout_s = ready_timeout_s
        self.cwd = cwd
        self._kept_log = log
        self._log: IO[bytes] | None = None  # created when started, removed when stopped (unless ``log`` was given)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.url}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint (perf_analyzer's ``-u`` with ``-i grpc``)."""
        if self.grpc_port is None:
            raise RuntimeError(f"{self.name} was started without a gRPC port")
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log_path(self) -> Path | None:
        """The server's output (stdout and stderr) once started; removed when the server stops, kept when it failed
        to start."""
        return Path(self._log.name) if self._log is not None else None

    def log_text(self) -> str:
        """The server's output so far ("" before it started)."""
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def __enter__(self) -> ServerProcess:
        self.start()
        return self.wait_ready()

    def start(self) -> None:
        """Start the process without waiting for it (``wait_ready`` waits), so that several servers can start side
        by side; from the thread that will outlive it (the child is signalled when its parent thread ends)."""
        if self._kept_log is not None:
            self._log = self._kept_log.open("wb")
        else:
            self._log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)  # noqa: SIM115 (closed in close)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                preexec_fn=die_with_parent,  # a killed benchmark (a test's timeout) leaves no server running
            )
        except OSError:
            self._remove_log()  # nothing was written to it
            raise

    def wait_ready(self) -> ServerProcess:
        """Wait until the started server answers its ready path; stopped, with its log kept, when it does not."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._failed(f"exited with code {self.proc.returncode} before it was ready")
            try:
                if httpx.get(f"{self.base_url}{self.ready_path}", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise self._failed(f"not ready after {self.ready_timeout_s:.0f} s")

    def _failed(self, what: str) -> RuntimeError:
        """The start failed: keep the log (its path is printed, and named in the error) for the user to read."""
        assert self._log is not None
        self._log.close()
        print(f"{self.name} {what}; its output is kept in {self.log_path}", file=sys.stderr)
        return RuntimeError(
            f"{self.name} {what} (log: {self.log_path}).\n"
            f"command: {' '.join(self.argv)}\n--- its output ---\n{self.log_tail()}"
        )

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop it and remove its temporary log (a ``log`` given to it is kept)."""
        self.stop()
        self._remove_log()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _remove_log(self) -> None:
        if self._log is not None:
            self._log.close()
            if self._kept_log is None:
                Path(self._log.name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------
# modelsvc


def modelsvc_executable() -> Path | None:
    beside = Path(sys.executable).parent / "modelsvc"
    if beside.exists():
        return beside
    found = shutil.which("modelsvc")
    return Path(found) if found else None


def modelsvc_server(
    repo: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    *,
    as_module: bool = False,
    extra_args: Sequence[str] = (),
    log: Path | None = None,
) -> ServerProcess:
    """``modelsvc serve`` on ``repo``, on free HTTP, gRPC and metrics ports of 127.0.0.1: the console script, or
    ``python -m modelsvc`` with this interpreter when ``as_module``; ``extra_args`` follow the ports; ``log`` keeps
    its output in that file."""
    if as_module:
        command = [sys.executable, "-m", "modelsvc"]
    elif (exe := modelsvc_executable()) is not None:
        command = [str(exe)]
    else:
        raise RuntimeError("modelsvc console script not found: run `.venv/bin/pip install -e . --no-deps`")
    http, grpc, metrics = free_port(), free_port(), free_port()
    argv = [
        *command, "serve",
        "--model-repository", str(repo),
        "--http-port", str(http),
        "--grpc-port", str(grpc),
        "--metrics-port", str(metrics),
        "--http-address", "127.0.0.1",
        *extra_args,
    ]  # fmt: skip
    return ServerProcess(
        "modelsvc", argv, http, ready_timeout_s=ready_timeout_s, grpc_port=grpc, metrics_port=metrics, log=log
    )


# ---------------------------------------------------------------------------------------------------------
# an example service as it runs in production, and the naive one-process service it is measured against


def logicd_server(service: Path, model_url: str, ready_timeout_s: float = READY_TIMEOUT_S) -> ServerProcess:
    """``logicd serve SERVICE`` against the model service at ``model_url``."""
    http = free_port()
    argv = [
        sys.executable, "-m", "logicd", "serve", str(service),
        "--host", "127.0.0.1", "--port", str(http), "--model-url", model_url,
    ]  # fmt: skip
    return ServerProcess(
        "logicd", argv, http, ready_path="/health/ready", ready_timeout_s=ready_timeout_s, cwd=ROOT
    )


@contextmanager
def service_pair(service: str, ready_timeout_s: float = 120.0, model_repository: Path | None = None) -> Iterator[str]:
    """The example service ``services/<service>`` as two processes, ``modelsvc serve`` on its model repository
    (or ``model_repository``) and ``logicd serve`` on its folder; yields the logic server's base URL. Its model
    must be built first (``python -m services.build``)."""
    folder = ROOT / "services" / service
    with (
        modelsvc_server(model_repository or folder / "model_repository", ready_timeout_s) as model,
        logicd_server(folder, model.base_url, ready_timeout_s) as logic,
    ):
        yield logic.base_url


@contextmanager
def naive_service(model: Path | None = None) -> Iterator[str]:
    """loadtests/naive_service.py (on the ONNX file ``model``, by default the doc_classifier's) in a child process
    on a free port; yields its base URL."""
    http = free_port()
    argv = [sys.executable, "-m", "loadtests.naive_service", "--port", str(http)]
    argv += ["--model", str(model)] if model else []
    with ServerProcess("naive_service", argv, http, ready_path="/health/ready", cwd=ROOT) as proc:
        yield proc.base_url


# ---------------------------------------------------------------------------------------------------------
# Real Triton 2.51 from the nvidia-pytriton wheel (python backend only)

TRITON_IDENTITY_MODEL_PY = '''\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Identity: OUTPUT0 = INPUT0 for every request of the batch."""

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return responses
'''


def pytriton_dir() -> Path | None:
    """The installed ``pytriton`` package folder, or None when nvidia-pytriton is not installed."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def write_triton_identity(repo: Path, name: str, config_text: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(TRITON_IDENTITY_MODEL_PY)
    (repo / name / "config.pbtxt").write_text(config_text)


def triton_server(repo: Path, workdir: Path) -> ServerProcess:
    """tritonserver from the wheel, copied with its python backend stub as PyTriton does, on free ports."""
    pkg = pytriton_dir()
    if pkg is None:
        raise RuntimeError("nvidia-pytriton not installed")
    dist = Path(tempfile.mkdtemp(prefix="tritonserver-", dir=workdir))  # one per start: part r starts another
    shutil.copytree(
        pkg / "tritonserver", dist, ignore=shutil.ignore_patterns("python_backend_stubs"), dirs_exist_ok=True
    )
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pkg / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"no python backend stub for Python {version} in nvidia-pytriton")
    shutil.copy(stub, dist / "backends" / "python" / "triton_python_backend_stub")
    env = dict(os.environ)
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(pkg.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    # The stub embeds Python and must find an environment with numpy < 2 first on PATH: this venv.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    http, grpc = free_port(), free_port()
    argv = [
        str(dist / "bin" / "tritonserver"),
        "--model-repository", str(repo),
        "--backend-directory", str(dist / "backends"),
        "--cache-directory", str(dist / "caches"),
        "--http-address", "127.0.0.1", "--http-port", str(http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
        "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
    ]  # fmt: skip
    return ServerProcess("tritonserver", argv, http, env=env, grpc_port=grpc)
