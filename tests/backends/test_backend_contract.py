"""The contract every backend keeps, checked for each entry of BACKEND_CASES with real models and a real server.

For the same two models (``add_sub`` and ``identity``) and the same configs, whatever the backend:

- in process: the repository reads the model from its folder, ``get_backend`` creates its instances, and an
  instance executes a batch of several rows with a variable dimension (FP32, INT32, INT64), outputs right;
- a config that disagrees with the model (a datatype, the dims) fails ``autocomplete`` with ModelLoadError naming
  the model and the tensor, and such a model stays UNAVAILABLE on a server with that reason while the others serve;
- through ``modelsvc serve``: tritonclient HTTP and gRPC get the right outputs and the right model metadata;
  concurrent requests are batched by the dynamic batcher; a wrong datatype or shape is a 400 / INVALID_ARGUMENT
  naming the tensor, and the server serves on;
- inputs that each fit the config but not each other (add_sub's INPUT0 [2,3] with INPUT1 [2,4]) are refused by
  the instance and, through the server, are a 400 / INVALID_ARGUMENT naming both inputs and their shapes, each
  request of a merged batch hearing of its own, good requests beside them served (issue 29).

A new backend adds one entry to BACKEND_CASES: a BackendCase whose ``write`` puts a model folder (config.pbtxt,
version folder, model file) into a repository. What the existing tests of a backend already cover in depth (every
datatype, providers, BLS, ...) stays in its own test file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.backends import ModelLoadError, get_backend
from modelsvc.protocol import ErrorKind, ModelsvcError
from modelsvc.repository import ModelRepository
from modelsvc.tools import onnx_models as om
from tests._python_models import write_python_model
from tests._server import ModelsvcProcess, wait_for
from tests.backends.test_onnxruntime_backend import instances
from tests.backends.test_openvino_backend import write_ir
from tests.backends.test_tensorrt_engine import build_plan, gpu_skip_reason
from tests.conftest import infer_input

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Spec:
    """A test model: ``add_sub`` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1) or ``identity``
    (OUTPUT0 = INPUT0), every tensor of ``datatype`` with dims [batch, -1]."""

    kind: str
    datatype: str

    @property
    def inputs(self) -> list[str]:
        return ["INPUT0", "INPUT1"] if self.kind == "add_sub" else ["INPUT0"]

    @property
    def outputs(self) -> list[str]:
        return ["OUTPUT0", "OUTPUT1"] if self.kind == "add_sub" else ["OUTPUT0"]

    def expected(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        a = inputs["INPUT0"]
        if self.kind == "identity":
            return {"OUTPUT0": a}
        return {"OUTPUT0": a + inputs["INPUT1"], "OUTPUT1": a - inputs["INPUT1"]}


@dataclass(frozen=True)
class BackendCase:
    """How one backend's models are written: ``write(repo, name, spec, config)`` makes ``repo/name`` with
    ``config`` as its config.pbtxt and a version folder 1 holding a model file that computes ``spec``."""

    backend: str
    write: Callable[[Path, str, Spec, str], None]
    device: str = "cpu"
    """Where its instances run when the repository is read in process (``gpu:0`` for a GPU-only backend)."""
    exact_int64: bool = True
    """False where the runtime computes INT64 in 32 bits (OpenVINO's CPU plugin): the backend answers a 400 for
    values beyond, so the checks of ``identity_int64`` (values up to 2**40) are skipped and gRPC uses INT32."""


def _write_onnx(repo: Path, name: str, spec: Spec, config: str) -> None:
    dims: list[int | str] = ["batch", "n"]
    model = om.add_sub(dims) if spec.kind == "add_sub" else om.identity(spec.datatype, dims)
    assert spec.kind == "identity" or spec.datatype == "FP32", "onnx_models.add_sub is FP32"
    om.write_model(repo, name, model, config)


#: a model.py for any Spec: it declares its tensors in auto_complete_config, as Triton recommends, so that a config
#: that disagrees with it fails the load
MODEL_PY = """\
import triton_python_backend_utils as pb_utils

INPUTS = {inputs!r}
OUTPUTS = {outputs!r}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in INPUTS:
            config.add_input({{"name": name, "data_type": {data_type!r}, "dims": [-1]}})
        for name in OUTPUTS:
            config.add_output({{"name": name, "data_type": {data_type!r}, "dims": [-1]}})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if len(INPUTS) == 1:
                outputs = [pb_utils.Tensor("OUTPUT0", a)]
            else:
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if a.shape != b.shape:  # what Triton's python backend leaves to the model: a raise would be a 500
                    shown = [f"{{n}} [{{','.join(map(str, x.shape))}}]" for n, x in (("INPUT0", a), ("INPUT1", b))]
                    message = f"inputs {{' and '.join(shown)}} do not fit: add_sub takes one shape"
                    error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def _write_python(repo: Path, name: str, spec: Spec, config: str) -> None:
    model_py = MODEL_PY.format(inputs=spec.inputs, outputs=spec.outputs, data_type=f"TYPE_{spec.datatype}")
    write_python_model(repo, name, model_py, config)


def _write_tensorrt(repo: Path, name: str, spec: Spec, config: str) -> None:
    """A plan built from the ONNX model with TensorRT's builder, on GPU instances; skips without TensorRT and a GPU."""
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    dims: list[int | str] = ["batch", "n"]
    model = om.add_sub(dims) if spec.kind == "add_sub" else om.identity(spec.datatype, dims)
    plan = build_plan(model, [{n: ((1, 1), (4, 8), (8, 64)) for n in spec.inputs}])
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.plan").write_bytes(plan)
    (repo / name / "config.pbtxt").write_text(config + "instance_group [ { kind: KIND_GPU } ]\n")


def _write_openvino(repo: Path, name: str, spec: Spec, config: str) -> None:
    """An OpenVINO IR (model.xml + model.bin) converted from the ONNX model."""
    dims: list[int | str] = ["batch", "n"]
    model = om.add_sub(dims) if spec.kind == "add_sub" else om.identity(spec.datatype, dims)
    write_ir(repo, name, model, config)


def _write_pytorch(repo: Path, name: str, spec: Spec, config: str) -> None:
    """A scripted module, ``forward(INPUT0[, INPUT1])``, carrying its tensors in an embedded config.pbtxt (TorchScript
    has no types or shapes of its own), so that a config that disagrees with it fails the load; skips without torch."""
    from tests.backends.test_pytorch_backend import AddSub, Identity, write_torchscript

    def declared(names: list[str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_{spec.datatype} dims: [ -1 ] }}' for n in names)

    embedded = f"max_batch_size: 8\ninput [ {declared(spec.inputs)} ]\noutput [ {declared(spec.outputs)} ]\n"
    write_torchscript(repo, name, AddSub() if spec.kind == "add_sub" else Identity(), config, embedded)


#: one entry per backend; a new backend adds its own here
BACKEND_CASES = [
    BackendCase("onnxruntime", _write_onnx),
    BackendCase("python", _write_python),
    pytest.param(BackendCase("tensorrt", _write_tensorrt, device="gpu:0"), marks=pytest.mark.gpu),
    BackendCase("pytorch", _write_pytorch),
    BackendCase("openvino", _write_openvino, exact_int64=False),
]

ADD_SUB = Spec("add_sub", "FP32")
SPECS = {"add_sub": ADD_SUB, "identity_int32": Spec("identity", "INT32"), "identity_int64": Spec("identity", "INT64")}
#: four requests wait (30 s) until the preferred batch of 4 forms, then run as one batch
HELD_BATCHING = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"
#: models whose config disagrees with the model file: name -> (the config's change, the tensor it concerns)
MISMATCHES = {
    "bad_datatype": ('"INPUT0" data_type: TYPE_FP32', '"INPUT0" data_type: TYPE_INT32', "INPUT0"),
    "bad_dims": ('"INPUT1" data_type: TYPE_FP32 dims: [ -1', '"INPUT1" data_type: TYPE_FP32 dims: [ 4, 4', "INPUT1"),
}


def config(name: str, backend: str, spec: Spec, batching: str = "dynamic_batching { }") -> str:
    def tensors(names: list[str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_{spec.datatype} dims: [ -1 ] }}' for n in names)

    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 8\n'
        f"input [ {tensors(spec.inputs)} ]\noutput [ {tensors(spec.outputs)} ]\n{batching}\n"
    )


def batch(spec: Spec, rows: int = 3, n: int = 5, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    dtype = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64}[spec.datatype]
    if spec.datatype == "FP32":
        return {name: rng.standard_normal((rows, n)).astype(dtype) for name in spec.inputs}
    high = 2**40 if dtype is np.int64 else 2**20  # INT64 values that INT32 could not hold
    return {name: rng.integers(-high, high, (rows, n)).astype(dtype) for name in spec.inputs}


def assert_outputs(spec: Spec, inputs: dict[str, np.ndarray[Any, Any]], got: Callable[[str], Any]) -> None:
    for name, want in spec.expected(inputs).items():
        array = got(name)
        assert array.dtype == want.dtype, name
        np.testing.assert_array_equal(array, want, err_msg=name)


@pytest.fixture(scope="module", params=BACKEND_CASES, ids=lambda case: case.backend)
def case(request: pytest.FixtureRequest) -> BackendCase:
    result: BackendCase = request.param
    return result


@pytest.fixture(scope="module")
def repository(case: BackendCase, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp(f"contract_{case.backend}")
    for name, spec in SPECS.items():
        case.write(repo, name, spec, config(name, case.backend, spec))
    case.write(repo, "held", ADD_SUB, config("held", case.backend, ADD_SUB, HELD_BATCHING))
    for name, (old, new, _) in MISMATCHES.items():
        text = config(name, case.backend, ADD_SUB)
        assert old in text
        case.write(repo, name, ADD_SUB, text.replace(old, new))
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ModelsvcProcess]:
    """The repository served; its mismatched models fail to load, so the server is live but never ready."""
    yield from serve_contract(repository)


def serve_contract(repository: Path, *extra: str) -> Iterator[ModelsvcProcess]:
    """``modelsvc serve`` on the contract's repository (with ``extra`` flags), once its good models are loaded."""
    proc = ModelsvcProcess(repository, "--exit-on-error", "false", *extra).start()
    try:

        def loaded() -> bool:
            assert proc.proc is not None
            assert proc.proc.poll() is None, proc.log()
            try:
                ready = [httpx.get(f"{proc.base}/v2/models/{m}/ready", timeout=5) for m in [*SPECS, "held"]]
            except httpx.TransportError:
                return False
            return all(r.status_code == 200 for r in ready)

        wait_for(loaded, "the good models to load", timeout=120)
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def http(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url) as client:
        yield client


# --- in process ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_an_instance_executes_a_batch(case: BackendCase, repository: Path, name: str) -> None:
    spec = SPECS[name]
    if spec.datatype == "INT64" and not case.exact_int64:
        pytest.skip(f"{case.backend} computes INT64 in 32 bits")
    gpus = () if case.device == "cpu" else None  # a CPU backend is read as on a machine without GPUs
    created = instances(ModelRepository(repository, gpus=gpus).load(name))
    try:
        assert created
        for instance in created:
            assert instance.name
            assert instance.device == case.device
            assert instance.providers
            inputs = batch(spec, rows=4, n=7)
            out = instance.execute(inputs, spec.outputs)
            assert list(out) == spec.outputs
            assert_outputs(spec, inputs, out.__getitem__)
            assert list(instance.execute(inputs, spec.outputs[-1:])) == spec.outputs[-1:]
    finally:
        for instance in created:
            instance.close()


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_a_config_that_disagrees_with_the_model_fails_the_load(case: BackendCase, repository: Path, name: str) -> None:
    source = ModelRepository(repository, strict_model_config=True, gpus=()).load(name)  # read, not completed
    with pytest.raises(ModelLoadError) as info:
        get_backend(source.config).autocomplete(source.config, source.artifact(1))
    message = str(info.value)
    assert f"model '{name}'" in message
    assert f"'{MISMATCHES[name][2]}'" in message


# --- through a real server ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_http_inference_and_metadata(case: BackendCase, http: httpclient.InferenceServerClient, name: str) -> None:
    spec = SPECS[name]
    if spec.datatype == "INT64" and not case.exact_int64:
        pytest.skip(f"{case.backend} computes INT64 in 32 bits")
    inputs = batch(spec, rows=3, n=6, seed=1)
    result = http.infer(name, [infer_input(k, v) for k, v in inputs.items()])
    assert_outputs(spec, inputs, result.as_numpy)
    metadata = http.get_model_metadata(name)
    shown = {key: [(t["name"], t["datatype"], t["shape"]) for t in metadata[key]] for key in ("inputs", "outputs")}
    assert shown == {
        "inputs": [(n, spec.datatype, [-1, -1]) for n in spec.inputs],
        "outputs": [(n, spec.datatype, [-1, -1]) for n in spec.outputs],
    }


def test_grpc_inference(case: BackendCase, server: ModelsvcProcess) -> None:
    model = "identity_int64" if case.exact_int64 else "identity_int32"
    spec = SPECS[model]
    inputs = batch(spec, rows=5, n=2, seed=2)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        grpc_inputs = []
        for name, array in inputs.items():
            grpc_inputs.append(grpcclient.InferInput(name, list(array.shape), spec.datatype))
            grpc_inputs[-1].set_data_from_numpy(array)
        result = client.infer(model, grpc_inputs)
    assert_outputs(spec, inputs, result.as_numpy)


def test_concurrent_requests_are_batched(server: ModelsvcProcess) -> None:
    before = server.model_stats("held")
    sent = [batch(ADD_SUB, rows=1, n=4, seed=seed) for seed in range(4)]

    def send(inputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        with httpclient.InferenceServerClient(server.url) as client:
            return client.infer("held", [infer_input(k, v) for k, v in inputs.items()])

    started = time.monotonic()
    with ThreadPoolExecutor(len(sent)) as pool:
        results = list(pool.map(send, sent))
    assert time.monotonic() - started < 25, "the batch did not form: it waited out its delay"
    for inputs, result in zip(sent, results, strict=True):
        assert_outputs(ADD_SUB, inputs, result.as_numpy)
    after = server.model_stats("held")
    requests = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == len(sent)
    assert executions < requests


def test_a_bad_request_is_invalid_argument_naming_the_tensor(
    server: ModelsvcProcess, http: httpclient.InferenceServerClient
) -> None:
    good = batch(ADD_SUB, rows=2, n=3)
    wrong_type = {**good, "INPUT1": good["INPUT1"].astype(np.int32)}
    wrong_shape = {**good, "INPUT1": good["INPUT1"][0]}  # no batch dimension
    for inputs in (wrong_type, wrong_shape):
        with pytest.raises(InferenceServerException) as info:
            http.infer("add_sub", [infer_input(k, v) for k, v in inputs.items()])
        assert info.value.status() == "400"
        assert "INPUT1" in str(info.value)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        grpc_inputs = []
        for name, array in wrong_type.items():
            grpc_inputs.append(grpcclient.InferInput(name, list(array.shape), "INT32" if name == "INPUT1" else "FP32"))
            grpc_inputs[-1].set_data_from_numpy(array)
        with pytest.raises(InferenceServerException) as grpc_info:
            client.infer("add_sub", grpc_inputs)
    assert str(grpc_info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT1" in str(grpc_info.value)
    result = http.infer("add_sub", [infer_input(k, v) for k, v in good.items()])  # and the server serves on
    assert_outputs(ADD_SUB, good, result.as_numpy)


# --- inputs that each fit the config but not each other (issue 29) ----------------------------------------------


def mismatched(rows: int = 2) -> dict[str, np.ndarray[Any, Any]]:
    """add_sub's inputs, each fitting its config entry (dims [-1]), that the model cannot add: [rows,3] + [rows,4]."""
    rng = np.random.default_rng(rows)
    return {
        "INPUT0": rng.standard_normal((rows, 3)).astype(np.float32),
        "INPUT1": rng.standard_normal((rows, 4)).astype(np.float32),
    }


def assert_names_the_inputs(message: str, rows: int = 2) -> None:
    assert f"INPUT0 [{rows},3]" in message, message
    assert f"INPUT1 [{rows},4]" in message, message


def test_an_instance_refuses_inputs_that_do_not_fit_each_other(case: BackendCase, repository: Path) -> None:
    gpus = () if case.device == "cpu" else None
    created = instances(ModelRepository(repository, gpus=gpus).load("add_sub"))
    try:
        for instance in created:
            with pytest.raises(ModelsvcError) as info:
                instance.execute(mismatched(), ADD_SUB.outputs)
            assert info.value.kind is ErrorKind.INVALID_ARGUMENT, info.value
            assert_names_the_inputs(str(info.value))
            good = batch(ADD_SUB, rows=2, n=3)  # and the instance serves on
            assert_outputs(ADD_SUB, good, instance.execute(good, ADD_SUB.outputs).__getitem__)
    finally:
        for instance in created:
            instance.close()


def test_inputs_that_do_not_fit_each_other_are_invalid_argument_naming_them(
    server: ModelsvcProcess, http: httpclient.InferenceServerClient
) -> None:
    bad = mismatched()
    with pytest.raises(InferenceServerException) as info:
        http.infer("add_sub", [infer_input(k, v) for k, v in bad.items()])
    assert info.value.status() == "400"
    assert_names_the_inputs(str(info.value))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        grpc_inputs = []
        for name, array in bad.items():
            grpc_inputs.append(grpcclient.InferInput(name, list(array.shape), "FP32"))
            grpc_inputs[-1].set_data_from_numpy(array)
        with pytest.raises(InferenceServerException) as grpc_info:
            client.infer("add_sub", grpc_inputs)
    assert str(grpc_info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert_names_the_inputs(str(grpc_info.value))
    good = batch(ADD_SUB, rows=2, n=3)  # and the server serves on
    assert_outputs(ADD_SUB, good, http.infer("add_sub", [infer_input(k, v) for k, v in good.items()]).as_numpy)


def test_a_mismatch_fails_only_its_own_requests_each_naming_its_own_shapes(server: ModelsvcProcess) -> None:
    """Two mismatched requests (1 and 3 rows) fill "held"'s preferred batch of 4 and run as one batch: each hears
    of its own shapes. Mismatched requests sent among good ones to "add_sub" fail alone: the dynamic batcher
    merges only requests of the same shapes past the batch dimension, so a good one never shares their batch."""

    def send(model: str, inputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        with httpclient.InferenceServerClient(server.url) as client:
            try:
                return client.infer(model, [infer_input(k, v) for k, v in inputs.items()])
            except InferenceServerException as exc:
                return exc

    before = server.model_stats("held")
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(send, ["held", "held"], [mismatched(1), mismatched(3)]))
    assert time.monotonic() - started < 25, "the batch did not form: it waited out its delay"
    for rows, result in zip((1, 3), results, strict=True):
        assert isinstance(result, InferenceServerException), result
        assert result.status() == "400", result
        assert_names_the_inputs(str(result), rows)
    after = server.model_stats("held")
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 2

    sent = [mismatched(1) if i % 2 else batch(ADD_SUB, rows=1, n=4, seed=i) for i in range(8)]
    with ThreadPoolExecutor(len(sent)) as pool:
        answers = list(pool.map(send, ["add_sub"] * len(sent), sent))
    for inputs, answer in zip(sent, answers, strict=True):
        if inputs["INPUT0"].shape != inputs["INPUT1"].shape:
            assert isinstance(answer, InferenceServerException), answer
            assert answer.status() == "400", answer
            assert_names_the_inputs(str(answer), 1)
        else:
            assert not isinstance(answer, InferenceServerException), answer
            assert_outputs(ADD_SUB, inputs, answer.as_numpy)


def test_a_model_whose_config_disagrees_is_unavailable_with_the_reason(server: ModelsvcProcess) -> None:
    index = {row["name"]: row for row in httpx.post(f"{server.base}/v2/repository/index", timeout=10).json()}
    for name, (_, _, tensor) in MISMATCHES.items():
        assert index[name]["state"] == "UNAVAILABLE"
        assert f"'{tensor}'" in index[name]["reason"]
    assert all(index[name]["state"] == "READY" for name in [*SPECS, "held"])
