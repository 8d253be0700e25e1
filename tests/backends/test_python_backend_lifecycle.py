"""The python backend's life cycle and pb_utils in-process: initialize()'s args, finalize() and load failures in a
real server; then, without one, pb_utils imported to unit-test a model, its tensors, auto-complete configs and
error codes, unloading a version, and BLS's timeout and its refusal on the server's loop.

The models, written as a Triton user writes them: tests/_python_models.py. Serving, batching and BLS through a
server: tests/backends/test_python_backend.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.backends import BatchRequest, _inprocess, get_backend
from modelsvc.backends import python_utils as pb_utils
from modelsvc.protocol import InvalidArgument, NotFound
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, ModelManager
from modelsvc.tools import onnx_models as om
from tests._python_models import ADD_SUB_PY, HELPER_CONFIG, HELPER_PY, write_python_model
from tests._server import ModelsvcProcess
from tests.conftest import infer_input

pytestmark = pytest.mark.integration

WAIT = 60.0


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
