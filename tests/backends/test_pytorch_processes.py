"""The PyTorch backend in real processes: a modelsvc server over HTTP and gRPC (datatypes, names, strings in a batch,
errors, dynamic batching), and processes of their own for what is process-wide (PyTorch's settings) or must not
happen (serving ONNX importing torch). The in-process tests and the models are in
tests/backends/test_pytorch_backend.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the pytorch backend needs modelsvc[pytorch]")

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests._server import ModelsvcProcess  # noqa: E402
from tests.backends.test_pytorch_backend import (  # noqa: E402
    ROOT,
    AddSub,
    Identity,
    SubMul,
    Upper,
    add_sub_config,
    cfg,
    param,
    write_torchscript,
)
from tests.conftest import infer_input  # noqa: E402

pytestmark = pytest.mark.integration


# --- processes of their own -----------------------------------------------------------------------------------


def test_the_backend_without_torch_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from modelsvc.backends import BACKENDS, ModelLoadError\n"
        "try:\n    BACKENDS['pytorch']()\nexcept ModelLoadError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "backend 'pytorch' needs PyTorch" in out.stdout
    assert "pip install 'modelsvc[pytorch]'" in out.stdout


def test_serving_an_onnx_model_imports_neither_torch_nor_openvino(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom pathlib import Path\nimport numpy as np\nimport modelsvc.server\n"
        "from modelsvc.backends import get_backend\nfrom modelsvc.repository import ModelRepository\n"
        "from modelsvc.tools import onnx_models as om\n"
        f"repo = Path({str(tmp_path)!r})\n"
        "om.write_model(repo, 'm', om.identity('FP32', ['batch', 4]), None)\n"
        "src = ModelRepository(repo, gpus=()).load('m')\n"
        "inst = get_backend(src.config).create_instances(src.config, src.artifact(1), 1)[0]\n"
        "inst.execute({'INPUT0': np.ones((1, 4), np.float32)}, [])\n"
        "print(sorted(m for m in ('torch', 'openvino') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["[]"], out.stderr


# --- a real server --------------------------------------------------------------------------------------------

HELD = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"
#: a batching model with TYPE_STRING tensors: one dimension in all, so dims [ 1 ] reshaped to [ ] per item
STRINGS_BATCHED = """name: "upper"
backend: "pytorch"
max_batch_size: 4
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] } } ]
output [ { name: "UPPER__0" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] } },
         { name: "LENGTHS__1" data_type: TYPE_INT64 dims: [ 1 ] reshape { shape: [ ] } } ]
dynamic_batching { }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("pytorch_repo")
    write_torchscript(repo, "fp16", Identity(), cfg("fp16", [("INPUT0", "FP16", "-1")], [("OUTPUT0", "FP16", "-1")]))
    write_torchscript(
        repo,
        "indexed",
        SubMul(),
        cfg("indexed", [("INPUT__0", "INT32", "-1"), ("INPUT__1", "INT32", "-1")], [("OUTPUT__1", "INT32", "-1")]),
    )
    write_torchscript(repo, "add_sub", AddSub(), add_sub_config("add_sub", "dynamic_batching { }"))
    write_torchscript(repo, "upper", Upper(), STRINGS_BATCHED)
    # PyTorch's process-wide settings, asked for by two models: the first one loaded sets them
    threads = param("INTRA_OP_THREAD_COUNT", "1") + param("INTER_OP_THREAD_COUNT", "1")
    write_torchscript(repo, "threads_a", AddSub(), add_sub_config("threads_a", threads))
    threads = param("INTRA_OP_THREAD_COUNT", "2") + param("INTER_OP_THREAD_COUNT", "1")
    write_torchscript(repo, "threads_b", AddSub(), add_sub_config("threads_b", threads))
    held = cfg("held", [("INPUT0", "FP32", "-1"), ("INPUT1", "FP32", "-1")], [("OUTPUT0", "FP32", "-1")], HELD)
    write_torchscript(repo, "held", AddSub(), held.replace("KIND_CPU", "KIND_CPU count: 2"))
    proc = ModelsvcProcess(repo).start()
    try:
        proc.wait_ready(timeout=120)
        yield proc
    finally:
        proc.terminate()


def test_http_and_grpc_inference(server: ModelsvcProcess) -> None:
    half = np.linspace(-2, 2, 6, dtype=np.float16).reshape(2, 3)
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.full((2, 3), 3, np.int32)
    with httpclient.InferenceServerClient(server.url) as client:
        np.testing.assert_array_equal(client.infer("fp16", [infer_input("INPUT0", half)]).as_numpy("OUTPUT0"), half)
        result = client.infer("indexed", [infer_input("INPUT__0", a), infer_input("INPUT__1", b)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a * b)
        metadata = client.get_model_metadata("indexed")
        assert metadata["platform"] == "pytorch_libtorch"
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as grpc:
        inputs = []
        for name, array in (("INPUT__0", a), ("INPUT__1", b)):
            inputs.append(grpcclient.InferInput(name, list(array.shape), "INT32"))
            inputs[-1].set_data_from_numpy(array)
        np.testing.assert_array_equal(grpc.infer("indexed", inputs).as_numpy("OUTPUT__1"), a * b)


def test_process_wide_settings_are_set_by_the_first_model(server: ModelsvcProcess) -> None:
    log = server.log()
    first, second = (
        ("threads_a", "threads_b") if "'threads_a': PyTorch setting INTRA" in log else ("threads_b", "threads_a")
    )
    value = {"threads_a": 1, "threads_b": 2}
    assert f"model '{first}': PyTorch setting INTRA_OP_THREAD_COUNT={value[first]} (process-wide)" in log
    assert f"model '{first}': PyTorch setting INTER_OP_THREAD_COUNT=1 (process-wide)" in log
    assert (
        f"model '{second}': parameter INTRA_OP_THREAD_COUNT={value[second]} is ignored: the setting is process-wide "
        f"in PyTorch and model '{first}' set it to {value[first]} first"
    ) in log
    assert "INTER_OP_THREAD_COUNT=1 is ignored" not in log  # the same value: nothing to say
    assert log.count("PyTorch setting INTRA_OP_THREAD_COUNT") == 1


def test_pytorch_starts_with_passive_openmp_threads(server: ModelsvcProcess) -> None:
    if "OMP_WAIT_POLICY" in os.environ:
        pytest.skip("the environment sets OMP_WAIT_POLICY, which the server keeps")
    assert "PyTorch starts with OMP_WAIT_POLICY=PASSIVE" in server.log()


def test_strings_in_a_batch(server: ModelsvcProcess) -> None:
    text = np.array([[b"ab"], [b"cde"]], dtype=np.object_)
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("upper", [infer_input("text", text)])
    assert result.as_numpy("UPPER__0").tolist() == [[b"AB"], [b"CDE"]]
    assert result.as_numpy("LENGTHS__1").tolist() == [[2], [3]]


def test_a_shape_error_inside_forward_is_a_400_naming_the_inputs_and_the_server_serves_on(
    server: ModelsvcProcess,
) -> None:
    """Inputs that each fit the config but not each other: torch's shape check, a 400 naming them (issue 29)."""
    with httpclient.InferenceServerClient(server.url) as client:
        bad = [infer_input("INPUT0", np.ones((1, 3), np.float32)), infer_input("INPUT1", np.ones((1, 4), np.float32))]
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", bad)
        assert info.value.status() == "400"
        assert "INPUT0 [1,3]" in str(info.value.message())
        assert "INPUT1 [1,4]" in str(info.value.message())
        ok = [infer_input("INPUT__0", np.ones((1, 2), np.int32)), infer_input("INPUT__1", np.ones((1, 2), np.int32))]
        assert client.infer("indexed", ok).as_numpy("OUTPUT__1").tolist() == [[1, 1]]


def test_concurrent_requests_are_batched(server: ModelsvcProcess) -> None:
    before = server.model_stats("held")
    sent = [np.full((1, 4), float(i), np.float32) for i in range(4)]

    def send(array: np.ndarray[Any, Any]) -> Any:
        with httpclient.InferenceServerClient(server.url) as client:
            return client.infer("held", [infer_input("INPUT0", array), infer_input("INPUT1", array)])

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, sent))
    assert time.monotonic() - started < 25, "the batch did not form"
    for array, result in zip(sent, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array + array)
    after = server.model_stats("held")
    assert after["execution_count"] - before["execution_count"] < 4
