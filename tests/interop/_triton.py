"""A real Triton 2.51 (the tritonserver inside the nvidia-pytriton wheel) on free ports, once per session,
with a python-backend model repository: identity_fp32, identity_bytes, add_sub.

Skipped where nvidia-pytriton is not installed, unless ``MODELSVC_INTEROP=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtests.harness import _servers
from modelsvc.client import Client
from tests._server import ModelsvcProcess

INSTALL = "`.venv/bin/pip install nvidia-pytriton` (or `bash loadtests/setup.sh`)"

ADD_SUB_MODEL_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''

IDENTITY_FP32 = """name: "identity_fp32"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

IDENTITY_BYTES = """name: "identity_bytes"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ADD_SUB = """name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def write_repository(repo: Path) -> Path:
    _servers.write_triton_identity(repo, "identity_fp32", IDENTITY_FP32)
    _servers.write_triton_identity(repo, "identity_bytes", IDENTITY_BYTES)
    (repo / "add_sub" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "add_sub" / "1" / "model.py").write_text(ADD_SUB_MODEL_PY)
    (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB)
    return repo


def require_triton() -> None:
    """Skip where nvidia-pytriton is not installed; under ``MODELSVC_INTEROP=1`` (CI) that is a failure."""
    if _servers.pytriton_dir() is None:
        message = f"nvidia-pytriton (a real Triton 2.51) is not installed: run {INSTALL}"
        if os.environ.get("MODELSVC_INTEROP") == "1":
            pytest.fail(f"MODELSVC_INTEROP=1 but {message}", pytrace=False)
        pytest.skip(message)


@contextmanager
def beside_modelsvc(
    source: Path, workdir: Path, *triton_args: str
) -> Iterator[tuple[_servers.ServerProcess, ModelsvcProcess]]:
    """A real Triton (with ``triton_args`` added to its command line) and modelsvc, each serving its own copy of the
    model repository at ``source``; modelsvc ready."""
    require_triton()
    repo = workdir / "repository"
    shutil.copytree(source, repo)
    triton_process = _servers.triton_server(repo, workdir)
    triton_process.argv += list(triton_args)
    with triton_process as triton, ModelsvcProcess(repo) as ours:
        ours.wait_ready(60)
        yield triton, ours


@dataclass(frozen=True, slots=True)
class Triton:
    http_url: str
    grpc_url: str

    def url(self, scheme: str) -> str:
        return self.http_url if scheme == "http" else self.grpc_url


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Triton]:
    require_triton()
    workdir = tmp_path_factory.mktemp("triton")
    repo = write_repository(workdir / "repository")
    with _servers.triton_server(repo, workdir) as server:
        grpc_port = server.argv[server.argv.index("--grpc-port") + 1]
        found = Triton(http_url=server.base_url, grpc_url=f"grpc://127.0.0.1:{grpc_port}")
        with Client(found.grpc_url, timeout=10) as client:
            if not client.server_ready():
                raise RuntimeError(f"Triton's HTTP endpoint is ready but gRPC is not.\n{server.log_tail()}")
        yield found
