"""A real MLServer, one of the peers the benchmarks and the interop tests run beside modelsvc, from its own virtual
environment so that its dependencies (protobuf, numpy 2, grpcio) never meet the project's pinned ones.

``MLServerProcess`` writes ``settings.json`` (subclasses add their model folders) and starts ``mlserver start`` on
free 127.0.0.1 ports as a ``ServerProcess`` (ready on ``/v2/health/ready``, failing loudly with MLServer's log).
``executable()`` finds ``.venv-mlserver/bin/mlserver`` when it was built for ``REQUIREMENTS`` (tests/interop
builds it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from loadtests.harness._servers import ROOT, ServerProcess, free_port, marker_of

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


class MLServerProcess(ServerProcess):
    """``mlserver start`` on a folder holding ``settings.json`` and the models that ``write_folder`` adds (none
    here: a subclass writes its model folders after calling it); ``url`` and ``base`` once started."""

    def __init__(self, mlserver: Path, folder: Path) -> None:
        self.folder = folder
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSERVER_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(PYTHONUNBUFFERED="1", PATH=f"{mlserver.parent}{os.pathsep}{env.get('PATH', '')}")
        argv = [str(mlserver), "start", str(folder)]
        # MLServer keeps .metrics/ and .envs/ in its working directory
        super().__init__("mlserver", argv, free_port(), env, ready_timeout_s=READY_TIMEOUT_S, cwd=folder)

    @property
    def base(self) -> str:
        return self.base_url

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

    def __enter__(self) -> MLServerProcess:
        self.write_folder()
        super().__enter__()
        return self
