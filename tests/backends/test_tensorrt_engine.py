"""The GPU-only module of the tensorrt backend (``_tensorrt_engine``: ``PlanEngine``, ``describe_engine``).

Here, without TensorRT or a GPU, it runs against a stand-in of ``tensorrt`` and ``cuda.bindings.runtime``
(``tests._trt_standin``: host memory behind the "device" pointers, an add/sub engine with a data-dependent
output; the known faults have their tests in ``test_tensorrt_engine_faults``): that checks our
logic (buffers grown and reused, copies, the output allocator, profile selection, freeing everything on close,
the deserialization message), not TensorRT's API. With TensorRT and a GPU (``-m gpu``) the same code runs on
tiny plans built with TensorRT's builder from the ONNX models of ``modelsvc.tools.onnx_models``, directly and
served through tritonclient.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import modelsvc.backends
from modelsvc.backends import ModelLoadError
from modelsvc.backends._devices import visible_gpus
from modelsvc.protocol import InvalidArgument
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests._trt_standin import Memory, engine_module
from tests.backends.test_tensorrt_backend import parse
from tests.conftest import infer_input

Ranges = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Memory]]:
    """``_tensorrt_engine`` imported against the stand-ins of ``tests._trt_standin``; removed again afterwards."""
    with engine_module(monkeypatch) as loaded:
        yield loaded


SHAPES = [(2, 3), (8, 64), (1, 5)]


def test_plan_engine_against_the_standin(standin: tuple[Any, Memory]) -> None:
    module, memory = standin
    engine = module.PlanEngine(b"standin", device=2, profile=1)
    desc = engine.description
    assert [(t.name, t.is_input, t.datatype, t.dims) for t in desc.tensors] == [
        ("INPUT0", True, "TYPE_FP32", (-1, -1)),
        ("INPUT1", True, "TYPE_FP32", (-1, -1)),
        ("OUTPUT0", False, "TYPE_FP32", (-1, -1)),
        ("NONZERO", False, "TYPE_INT64", (-1,)),
    ]
    assert desc.profiles[1].shapes["INPUT1"] == ((1, 1), (1, 4), (2, 4))
    assert desc.trt_version == "10.99-standin"
    assert ("set_optimization_profile_async", (1, 4242)) in memory.calls
    assert ("cudaSetDevice", (2,)) in memory.calls
    rng = np.random.default_rng(0)
    feeds = [{name: rng.standard_normal(shape).astype(np.float32) for name in ("INPUT0", "INPUT1")} for shape in SHAPES]
    mallocs = []
    for feed in [*feeds, feeds[1]]:  # small, large, small, the large one again
        a, b = feed["INPUT0"], feed["INPUT1"]
        out = engine.infer({"INPUT0": a, "INPUT1": b.astype(np.float64)})  # converted to the engine's FP32
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["NONZERO"], np.flatnonzero(a > 0))
        assert out["NONZERO"].dtype == np.int64
        mallocs.append(memory.mallocs)
    assert mallocs[0] < mallocs[1] == mallocs[2] == mallocs[3]  # grown for the large batch, then reused
    with pytest.raises(ValueError, match="input 'INPUT1' is missing"):
        engine.infer({"INPUT0": np.zeros((1, 1), np.float32)})
    engine.close()
    engine.close()
    assert memory.device == {}
    assert memory.host == {}
    assert sum(call[0] == "cudaStreamDestroy" for call in memory.calls) == 1
    with pytest.raises(RuntimeError, match="closed"):
        engine.infer({})


def test_a_plan_that_does_not_deserialize_against_the_standin(standin: tuple[Any, Memory]) -> None:
    module, _ = standin
    with pytest.raises(ModelLoadError) as info:
        module.PlanEngine(b"from elsewhere", device=0)
    message = str(info.value)
    assert "This server: TensorRT 10.99-standin, GPU 0 of compute capability 9.0." in message
    assert "The plan: TensorRT 8.6.1.6, compute capability unknown." in message
    with pytest.raises(ModelLoadError, match="optimization profile 5 does not exist: the engine has 2"):
        module.PlanEngine(b"standin", profile=5)


def test_the_registered_backend_serves_instances_of_the_standin(standin: tuple[Any, Memory], tmp_path: Path) -> None:
    _, memory = standin
    backend = modelsvc.backends.BACKENDS["tensorrt"]()  # the registry's factory, not get_backend: nothing cached
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"standin")
    config = parse('name: "m" instance_group [ { name: "g" kind: KIND_GPU count: 2 gpus: [ 1 ] } ]')
    backend.autocomplete(config, plan)
    assert config.max_batch_size == 8
    assert [e.name for e in config.output] == ["OUTPUT0", "NONZERO"]
    created = backend.create_instances(config, plan, 1)
    assert [(i.name, i.device, i.providers) for i in created] == [
        ("g_0", "gpu:1", ["TensorRT 10.99-standin", "profile 0"]),
        ("g_1", "gpu:1", ["TensorRT 10.99-standin", "profile 1"]),
    ]
    wide = np.ones((2, 8), np.float32)
    with pytest.raises(InvalidArgument, match=r"input 'INPUT0' of model 'm' has shape \[2, 8\].*\[1, 1\]\.\.\[2, 4\]"):
        created[1].execute({"INPUT0": wide, "INPUT1": wide}, [])
    out = created[0].execute({"INPUT0": wide, "INPUT1": wide}, ["OUTPUT0"])
    assert list(out) == ["OUTPUT0"]
    np.testing.assert_array_equal(out["OUTPUT0"], wide * 2)
    for instance in created:
        instance.close()
    assert memory.device == {}
    assert memory.host == {}


# --- with TensorRT and a GPU ------------------------------------------------------------------------------------


def gpu_skip_reason() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    for module, extra in (("tensorrt", "TensorRT"), ("cuda.bindings", "cuda-python")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{extra} is not installed (pip install 'modelsvc[tensorrt]' on a GPU machine)"
    if not visible_gpus():
        return "no NVIDIA GPU is visible"
    return None


def build_plan(model: Any, profiles: list[Ranges]) -> bytes:
    """A plan of the ONNX ``model`` built with TensorRT's builder, one optimization profile per entry."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise AssertionError(f"TensorRT's ONNX parser failed: {errors}")
    config = builder.create_builder_config()
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if tf32 is not None:  # on by default: fp32 layers would run in TF32, while the tests compare at 1e-4 or closer
        config.clear_flag(tf32)
    for ranges in profiles:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in ranges.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None, "TensorRT could not build the plan"
    return bytes(serialized)


def needs_gpu() -> None:
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)


ADD_SUB_RANGES: Ranges = {name: ((1, 1), (4, 8), (8, 64)) for name in ("INPUT0", "INPUT1")}


@pytest.fixture(scope="module")
def add_sub_plan() -> bytes:
    needs_gpu()
    return build_plan(
        om.add_sub(["batch", "n"]), [ADD_SUB_RANGES, {k: ((1, 1), (1, 4), (2, 4)) for k in ADD_SUB_RANGES}]
    )


@pytest.mark.gpu
def test_plan_engine_outputs_and_description(add_sub_plan: bytes) -> None:
    from modelsvc.backends.tensorrt._tensorrt_engine import PlanEngine

    engine = PlanEngine(add_sub_plan, device=0, profile=0)
    try:
        desc = engine.description
        assert [(t.name, t.is_input, t.datatype, t.dims) for t in desc.tensors] == [
            ("INPUT0", True, "TYPE_FP32", (-1, -1)),
            ("INPUT1", True, "TYPE_FP32", (-1, -1)),
            ("OUTPUT0", False, "TYPE_FP32", (-1, -1)),
            ("OUTPUT1", False, "TYPE_FP32", (-1, -1)),
        ]
        assert desc.profiles[0].shapes["INPUT0"] == ((1, 1), (4, 8), (8, 64))
        assert len(desc.profiles) == 2
        rng = np.random.default_rng(0)
        for shape in [(3, 5), (8, 64), (1, 1), (5, 9)]:  # grows and reuses its buffers
            a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
            out = engine.infer({"INPUT0": a, "INPUT1": b})
            np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
            np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
    finally:
        engine.close()
        engine.close()
    second = PlanEngine(add_sub_plan, device=0, profile=1)
    try:
        a = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal(second.infer({"INPUT0": a, "INPUT1": a})["OUTPUT0"], a * 2)
    finally:
        second.close()


@pytest.mark.gpu
def test_a_plan_that_does_not_deserialize_says_which_versions() -> None:
    needs_gpu()
    from modelsvc.backends.tensorrt._tensorrt_engine import PlanEngine

    with pytest.raises(ModelLoadError, match=r"TensorRT could not deserialize the plan.*This server: TensorRT \d"):
        PlanEngine(b"ftrt" + bytes(1000), device=0)


@pytest.fixture(scope="module")
def plan_server(add_sub_plan: bytes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("plans")
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "1" / "model.plan").write_bytes(add_sub_plan)
    (repo / "add_sub" / "config.pbtxt").write_text(
        'name: "add_sub"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
        'instance_group [ { kind: KIND_GPU count: 1 profile: [ "0" ] } ]\n'
    )
    with ModelsvcProcess(repo) as proc:
        proc.wait_ready(timeout=120)
        yield proc


@pytest.mark.gpu
@pytest.mark.integration
def test_a_served_plan_through_tritonclient(plan_server: ModelsvcProcess) -> None:
    with httpclient.InferenceServerClient(plan_server.url) as client:
        metadata = client.get_model_metadata("add_sub")
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("INPUT0", "FP32", [-1, -1]),
            ("INPUT1", "FP32", [-1, -1]),
        ]
        assert client.get_model_config("add_sub")["max_batch_size"] == 8
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        result = client.infer("add_sub", [infer_input("INPUT0", a), infer_input("INPUT1", a)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 0)
        long = np.zeros((1, 65), np.float32)
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", [infer_input("INPUT0", long), infer_input("INPUT1", long)])
        assert info.value.status() == "400"
        assert "INPUT0" in str(info.value)
        assert "[1, 1]..[8, 64]" in str(info.value)
