"""Regression tests from the review of the gRPC endpoint and the python backend (each failed before its fix):
model error messages and codes over gRPC, helper modules of python models, a slow finalize().

Every expectation was checked against a real Triton 2.51 (nvidia-pytriton) with the same model.py files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

INT_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# returns the TritonError whose code the input names (0..7 in Triton's order), or raises (100, 101)
ERR_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils

CODES = [
    pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.INTERNAL, pb_utils.TritonError.NOT_FOUND,
    pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNAVAILABLE, pb_utils.TritonError.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS, pb_utils.TritonError.CANCELLED,
]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            if code == 100:
                raise pb_utils.TritonModelException("model exception text")
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("err text", CODES[code])))
        return responses
"""

HELPER_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils

import helpers


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([helpers.VALUE], dtype=np.int32))])
            for _ in requests
        ]
"""

SLOW_FINALIZE_PY = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]) for _ in requests]

    def finalize(self):
        time.sleep(4)
"""


def _model(repo: Path, name: str, code: str, helpers: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(INT_CONFIG.format(name=name))
    if helpers is not None:
        (repo / name / "1" / "helpers.py").write_text(helpers)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("review_repo")
    _model(repo, "err_py", ERR_PY)
    _model(repo, "helper_a", HELPER_PY, "VALUE = 1\n")
    _model(repo, "helper_b", HELPER_PY, "VALUE = 2\n")
    _model(repo, "slow_finalize", SLOW_FINALIZE_PY)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(repo, "--model-control-mode", "explicit", "--load-model", "*") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.close()


def _int_input(value: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return inp


def _value(client: grpcclient.InferenceServerClient, model: str) -> int:
    return int(client.infer(model, [_int_input(0)]).as_numpy("OUT")[0])


# -- 1. gRPC hides the messages python models write for the client (HTTP shows them, Triton too) ------------


@pytest.mark.parametrize(("code", "text"), [(1, "err text"), (100, "model exception text")])
def test_grpc_passes_on_a_python_models_internal_error_message(
    client: grpcclient.InferenceServerClient, server: ModelsvcProcess, code: int, text: str
) -> None:
    # HTTP answers 500 with the model's message; Triton's gRPC answers INTERNAL with it, too


    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [code]}]}
    http = httpx.post(f"{server.base}/v2/models/err_py/infer", json=body, timeout=10)
    assert http.status_code == 500
    assert text in http.json()["error"]
    with pytest.raises(InferenceServerException) as info:
        client.infer("err_py", [_int_input(code)])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert text in info.value.message()


def test_grpc_stream_passes_on_a_python_models_internal_error_message(server: ModelsvcProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="err_py", id="r1")
        request.inputs.add(name="IN", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
        (answer,) = list(stub.ModelStreamInfer(iter([request]), timeout=20))
    assert answer.error_message == "err text"


# -- 2. TritonError codes without a server error of their own get another gRPC code than in Triton -----------


@pytest.mark.parametrize(
    ("code", "status"),
    [(0, "StatusCode.UNKNOWN"), (6, "StatusCode.ALREADY_EXISTS"), (7, "StatusCode.CANCELLED")],
)
def test_triton_error_codes_keep_their_grpc_status(
    client: grpcclient.InferenceServerClient, code: int, status: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("err_py", [_int_input(code)])
    assert info.value.status() == status


# -- 3. helper modules next to model.py: one per process, never re-imported ----------------------------------


def test_two_models_importing_helpers_of_one_name_each_get_their_own(client: grpcclient.InferenceServerClient) -> None:
    assert _value(client, "helper_a") == 1
    assert _value(client, "helper_b") == 2  # Triton: 2 (each model has its own process); modelsvc: 1


def test_reloading_a_python_model_picks_up_its_changed_helper_module(
    client: grpcclient.InferenceServerClient, repo: Path
) -> None:
    _value(client, "helper_a")
    (repo / "helper_a" / "1" / "helpers.py").write_text("VALUE = 3\n")
    try:
        client.load_model("helper_a")  # a reload: the new version is built from the files on disk
        assert _value(client, "helper_a") == 3  # Triton: 3; modelsvc: still 1
    finally:
        (repo / "helper_a" / "1" / "helpers.py").write_text("VALUE = 1\n")


# -- 4. finalize() runs while the server's event loop waits for it ------------------------------------------


def test_a_slow_finalize_does_not_stall_the_server(server: ModelsvcProcess) -> None:
    target = f"127.0.0.1:{server.grpc_port}"
    unloader = grpcclient.InferenceServerClient(target)
    prober = grpcclient.InferenceServerClient(target)
    try:
        assert prober.is_model_ready("slow_finalize")
        worker = threading.Thread(target=unloader.unload_model, args=("slow_finalize",))
        worker.start()
        deadline = time.monotonic() + 3.0  # finalize sleeps 4 s
        worst = 0.0
        while time.monotonic() < deadline:
            start = time.monotonic()
            prober.is_server_live(client_timeout=10)
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.05)
        worker.join(30)
        assert worst < 1.0, f"ServerLive took {worst:.1f} s while finalize() ran"
    finally:
        unloader.close()
        prober.close()
