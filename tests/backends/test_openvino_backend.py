"""The openvino backend's own behaviour (the contract it shares with the others is in test_backend_contract.py):
Triton's parameters and modelsvc's INFERENCE_PRECISION_HINT, reshaping (dynamic batch, RESHAPE_IO_LAYERS, a fixed
batch and its padding), the config completed from an IR and checked against it, datatypes, instances per
compiled model, and ONNX models whose config names the ``openvino`` CPU execution accelerator, served next to the
same model on ONNX Runtime (HTTP and gRPC answers equal within tolerance, GET /config unchanged)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from modelsvc.backends import ConfigMismatchError, ModelConfig, ModelInstance, ModelLoadError, get_backend
from modelsvc.protocol import InvalidArgument
from modelsvc.repository import ModelRepository
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess, wait_for
from tests.conftest import infer_input

ov = pytest.importorskip("openvino")

BACKEND = 'backend: "openvino"\n'


def write_ir(
    repo: Path, name: str, model: onnx.ModelProto, config: str | None, static: list[int] | None = None
) -> Path:
    """``repo/name/1/model.xml`` + ``model.bin`` converted from the ONNX ``model`` (its inputs reshaped to the
    static shape ``static`` where given), and ``config.pbtxt`` when given."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    source = version / "source.onnx"
    onnx.save(model, str(source))
    converted = ov.Core().read_model(str(source))  # 10x faster than convert_model + save_model's transformations
    source.unlink()
    if static is not None:
        converted.reshape({port.get_any_name(): static for port in converted.inputs})
    ov.serialize(converted, str(version / "model.xml"))
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def load(repo: Path, name: str) -> list[ModelInstance]:
    source = ModelRepository(repo, gpus=()).load(name)
    return get_backend(source.config).create_instances(source.config, source.artifact(1), 1)


def identity_config(name: str, datatype: str = "FP32", extra: str = "", mbs: int = 8, dims: str = "-1") -> str:
    return (
        f'name: "{name}"\n{BACKEND}max_batch_size: {mbs}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_{datatype} dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [ {dims} ] }} ]\n{extra}\n'
    )


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def test_the_keys_other_layers_read_are_accepted() -> None:
    from modelsvc.backends.openvino._openvino_options import OTHER_KEYS
    from modelsvc.scheduler._padding import KEYS

    assert set(OTHER_KEYS) == set(KEYS)


# --- in process ---------------------------------------------------------------------------------------------


def test_a_config_is_completed_from_the_ir(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.add_sub(["batch", "n"]), f'name: "m"\n{BACKEND}')
    config = ModelRepository(tmp_path, gpus=()).load("m").config
    assert config.max_batch_size == 4  # Triton's default-max-batch-size for a model that batches
    assert config.HasField("dynamic_batching")
    shown = [(t.name, t.data_type, list(t.dims)) for t in [*config.input, *config.output]]
    fp32 = 11  # TYPE_FP32
    assert shown == [("INPUT0", fp32, [-1]), ("INPUT1", fp32, [-1]), ("OUTPUT0", fp32, [-1]), ("OUTPUT1", fp32, [-1])]
    write_ir(tmp_path, "by_platform", om.add_sub(["batch", "n"]), 'name: "by_platform"\nplatform: "openvino"\n')
    assert get_backend(ModelRepository(tmp_path, gpus=()).load("by_platform").config).name == "openvino"


def test_an_onnx_file_through_default_model_filename(tmp_path: Path) -> None:
    om.write_model(
        tmp_path,
        "m",
        om.identity("FP32", ["batch", 4]),
        identity_config("m", dims="4").replace(BACKEND, BACKEND + 'default_model_filename: "model.onnx"\n'),
    )
    (instance,) = load(tmp_path, "m")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)
    assert instance.providers == ["OpenVINO CPU"]


def test_reshape_io_layers_makes_a_static_ir_dynamic(tmp_path: Path) -> None:
    write_ir(
        tmp_path,
        "m",
        om.identity("FP32", [1, 16]),
        identity_config("m", extra=param("RESHAPE_IO_LAYERS", "YES")),
        static=[1, 16],
    )
    (instance,) = load(tmp_path, "m")
    x = np.ones((3, 7), dtype=np.float32)  # another batch and another length than the IR's [1, 16]
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)


def test_a_minus_one_in_the_config_makes_a_static_dimension_dynamic(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.identity("FP32", [1, 16]), identity_config("m", mbs=0, dims="1, -1"), static=[1, 16])
    (instance,) = load(tmp_path, "m")
    x = np.ones((1, 5), np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)


def test_a_static_ir_answers_400_for_another_shape(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.identity("FP32", [1, 16]), identity_config("m", mbs=0, dims="1, 16"), static=[1, 16])
    (instance,) = load(tmp_path, "m")
    with pytest.raises(InvalidArgument, match=r"input 'INPUT0' of model 'm': shape \[1, 5\]"):
        instance.execute({"INPUT0": np.ones((1, 5), np.float32)}, [])


def test_an_ir_whose_tensor_names_differ_from_the_config(tmp_path: Path) -> None:
    config = identity_config("m").replace('"INPUT0"', '"input"')
    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), config)
    source = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("m")
    with pytest.raises(ConfigMismatchError, match=r"configuration input 'input' is not an input of the model 'm'"):
        get_backend(source.config).autocomplete(source.config, source.artifact(1))
    with pytest.raises(ModelLoadError, match="'input'"):  # the same check when the config was not completed
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (param("CPU_THREADS_NUM", "2"), "unknown parameter 'CPU_THREADS_NUM'"),
        (param("PERFORMANCE_HINT", "fast"), "'PERFORMANCE_HINT' must be LATENCY, THROUGHPUT or CUMULATIVE_THROUGHPUT"),
        (param("NUM_STREAMS", "many"), "'NUM_STREAMS' must be a non-negative integer, got 'many'"),
        (param("INFERENCE_NUM_THREADS", "-1"), "'INFERENCE_NUM_THREADS' must be a non-negative integer"),
        (param("RESHAPE_IO_LAYERS", "maybe"), "'RESHAPE_IO_LAYERS' must be YES or NO"),
        (param("HINT_BF16", "NO"), "'HINT_BF16' must be YES"),
        (param("INFERENCE_PRECISION_HINT", "int8"), "'INFERENCE_PRECISION_HINT' must be f32, bf16 or f16"),
        (param("TARGET_DEVICE", "NPU"), "'TARGET_DEVICE' is 'NPU', which OpenVINO does not see here"),
        (param("CPU_EXTENSION_PATH", "/nonexistent.so"), "'CPU_EXTENSION_PATH': OpenVINO cannot load"),
        ("instance_group [ { kind: KIND_GPU } ]", "is KIND_GPU"),
    ],
)
def test_bad_settings_fail_the_load_naming_model_and_key(tmp_path: Path, extra: str, fragment: str) -> None:
    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), identity_config("m", extra=extra))
    source = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("m")  # read, not completed
    with pytest.raises(ModelLoadError, match=fragment) as info:
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    assert "model 'm'" in str(info.value)


def test_precision_hint_logs_what_openvino_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), identity_config("m", extra=param("HINT_BF16", "YES")))
    with caplog.at_level(logging.INFO, logger="modelsvc.backends.openvino"):
        (instance,) = load(tmp_path, "m")
    lines = [r for r in caplog.records if "INFERENCE_PRECISION_HINT" in r.getMessage()]
    assert len(lines) == 1
    message = lines[0].getMessage()
    # read back from the compiled model: bf16 where the CPU has it, else f32 and a warning saying so
    if lines[0].levelno == logging.WARNING:
        assert "INFERENCE_PRECISION_HINT bf16 was asked, but OpenVINO compiled it to run f32" in message
    else:
        assert "INFERENCE_PRECISION_HINT bf16" in message
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)


def test_instances_are_the_infer_requests_of_one_compiled_model_per_group(tmp_path: Path) -> None:
    model = om.identity("FP32", ["batch", "n"])
    write_ir(tmp_path, "streams", model, identity_config("streams", extra=param("NUM_STREAMS", "2")))
    write_ir(tmp_path, "count", model, identity_config("count", extra="instance_group [ { count: 3 kind: KIND_CPU } ]"))
    assert [i.name for i in load(tmp_path, "streams")] == ["streams_0", "streams_1"]
    counted = load(tmp_path, "count")
    assert [i.name for i in counted] == ["count_0_0", "count_0_1", "count_0_2"]
    assert counted[0]._compiled.get_property("NUM_STREAMS") > 1  # type: ignore[attr-defined]  # 3, or the cores
    x = np.ones((1, 2), np.float32)
    for instance in counted:
        np.testing.assert_array_equal(instance.execute({"INPUT0": x}, [])["OUTPUT0"], x)
        instance.close()


def test_the_default_and_auto_instance_groups_run_on_the_cpu_on_a_gpu_machine(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), identity_config("m"))
    auto = identity_config("auto", extra="instance_group [ { kind: KIND_AUTO } ]")
    write_ir(tmp_path, "auto", om.identity("FP32", ["batch", "n"]), auto)
    for name in ("m", "auto"):
        source = ModelRepository(tmp_path, gpus=(0,)).load(name)  # read as on a machine with one GPU
        assert [g.kind for g in source.config.instance_group] == [2]  # KIND_CPU, as Triton's openvino prefers
        (instance,) = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
        assert instance.device == "cpu"


def test_a_fixed_batch_is_padded_only_when_asked(tmp_path: Path) -> None:
    skip = param("SKIP_OV_DYNAMIC_BATCHSIZE", "YES")
    model = om.add_sub(["batch", 4])
    write_ir(tmp_path, "fixed", model, f'name: "fixed"\n{BACKEND}max_batch_size: 4\n{skip}')
    write_ir(
        tmp_path,
        "padded",
        model,
        f'name: "padded"\n{BACKEND}max_batch_size: 4\n{skip}' + param("ENABLE_BATCH_PADDING", "YES"),
    )
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    (fixed,) = load(tmp_path, "fixed")
    with pytest.raises(InvalidArgument, match=r"runs batches of exactly 4 .* got 2.*ENABLE_BATCH_PADDING"):
        fixed.execute({"INPUT0": a, "INPUT1": b}, [])
    full = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(fixed.execute({"INPUT0": full, "INPUT1": full}, [])["OUTPUT0"], full * 2)
    (padded,) = load(tmp_path, "padded")
    out = padded.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)  # two rows back, the padding dropped


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "INT8", "INT16", "UINT32", "INT32", "FP16", "BF16", "FP64"])
def test_datatypes_round_trip(tmp_path: Path, datatype: str) -> None:
    from modelsvc.protocol import NUMPY_DTYPES

    if datatype not in NUMPY_DTYPES:
        pytest.skip("BF16 needs ml_dtypes")
    write_ir(tmp_path, "m", om.identity(datatype, ["batch", "n"]), identity_config("m", datatype))
    (instance,) = load(tmp_path, "m")
    x = (np.arange(6).reshape(2, 3) % 2 == 0) if datatype == "BOOL" else np.arange(6).reshape(2, 3)
    x = x.astype(NUMPY_DTYPES[datatype])
    out = instance.execute({"INPUT0": x}, [])["OUTPUT0"]
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)


def test_int64_beyond_32_bits_is_refused_not_wrapped(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.identity("INT64", ["batch", "n"]), identity_config("m", "INT64"))
    (instance,) = load(tmp_path, "m")
    small = np.array([[2**31 - 1, -(2**31)]], np.int64)
    np.testing.assert_array_equal(instance.execute({"INPUT0": small}, [])["OUTPUT0"], small)
    with pytest.raises(InvalidArgument, match="input 'INPUT0' of model 'm': OpenVINO's CPU plugin computes INT64"):
        instance.execute({"INPUT0": np.array([[2**40]], np.int64)}, [])


def test_string_models_are_refused(tmp_path: Path) -> None:
    write_ir(tmp_path, "m", om.identity("BYTES", ["batch", "n"]), identity_config("m", "STRING"))
    source = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("m")
    with pytest.raises(ModelLoadError, match=r"input 'INPUT0' of model 'm'.*string tensors"):
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)


@pytest.mark.parametrize("how", ["backend", "accelerator"])
def test_missing_openvino_names_the_extra(tmp_path: Path, how: str) -> None:
    if how == "backend":
        write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), identity_config("m"))
    else:
        om.write_model(tmp_path, "m", om.identity("FP32", ["batch", "n"]), ACCELERATED.format(name="m"))
    script = (
        "import sys; sys.modules['openvino'] = None\n"
        "from modelsvc.backends import get_backend\n"
        "from modelsvc.repository import ModelRepository\n"
        "try:\n"
        f"    s = ModelRepository({str(tmp_path)!r}, gpus=()).load('m')\n"
        "    get_backend(s.config).create_instances(s.config, s.artifact(1), 1)\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert "pip install 'modelsvc[openvino]'" in done.stdout, done.stdout + done.stderr


# --- ONNX models on the openvino CPU execution accelerator, served --------------------------------------------

ACCELERATED = (
    'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching {{ }}\n'
    'optimization {{ execution_accelerators {{ cpu_execution_accelerator [ {{ name: "openvino" }} ] }} }}\n'
)
PLAIN = 'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching {{ }}\n'


def test_the_accelerator_takes_no_parameters(tmp_path: Path) -> None:
    config = ACCELERATED.format(name="m").replace(
        'name: "openvino" }', 'name: "openvino" parameters { key: "device_type" value: "GPU" } }'
    )
    om.write_model(tmp_path, "m", om.identity("FP32", ["batch", "n"]), config)
    source = ModelRepository(tmp_path, gpus=()).load("m")
    with pytest.raises(ModelLoadError, match="'openvino' takes no parameters, got 'device_type'"):
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)


def test_the_accelerator_runs_f32_on_every_cpu(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As ONNX Runtime's OpenVINO provider runs a CPU (CPU_FP32): OpenVINO left to itself runs bf16 on a CPU with
    native bf16, which moved a classifier's logits by 2e-4 from ONNX Runtime's on an AVX-512 BF16 EPYC."""
    om.write_model(tmp_path, "m", om.identity("FP32", ["batch", "n"]), ACCELERATED.format(name="m"))
    source = ModelRepository(tmp_path, gpus=()).load("m")
    with caplog.at_level(logging.INFO, logger="modelsvc.backends.openvino"):
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    (line,) = [r.getMessage() for r in caplog.records if "INFERENCE_PRECISION_HINT" in r.getMessage()]
    assert "INFERENCE_PRECISION_HINT f32" in line, line


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("openvino_repo")
    classifier = om.token_classifier(vocab=500, hidden=32, labels=4, layers=2)
    om.write_model(repo, "tc_ort", classifier, PLAIN.format(name="tc_ort"))
    om.write_model(repo, "tc_ov", classifier, ACCELERATED.format(name="tc_ov"))
    bad_names = identity_config("bad_names").replace('"OUTPUT0"', '"logits"')
    write_ir(repo, "bad_names", om.identity("FP32", ["batch", "n"]), bad_names)
    bad_param = identity_config("bad_param") + param("NUM_STREAMS", "x")
    write_ir(repo, "bad_param", om.identity("FP32", ["batch", "n"]), bad_param)
    proc = ModelsvcProcess(repo, "--exit-on-error", "false").start()
    try:

        def loaded() -> bool:
            assert proc.proc is not None
            assert proc.proc.poll() is None, proc.log()
            try:
                return all(
                    httpx.get(f"{proc.base}/v2/models/{m}/ready", timeout=5).status_code == 200
                    for m in ("tc_ort", "tc_ov")
                )
            except httpx.TransportError:
                return False

        wait_for(loaded, "the ONNX models to load", timeout=120)
        yield proc
    finally:
        proc.terminate()


def _tokens(rows: int, seq: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    mask = np.ones((rows, seq), np.int64)
    mask[0, seq // 2 :] = 0
    return {"input_ids": rng.integers(0, 500, (rows, seq)).astype(np.int64), "attention_mask": mask}


def test_accelerated_answers_equal_onnx_runtime_over_http_and_grpc(server: ModelsvcProcess) -> None:
    inputs = _tokens(3, 9, seed=1)
    with httpclient.InferenceServerClient(server.url) as client:
        want = client.infer("tc_ort", [infer_input(k, v) for k, v in inputs.items()]).as_numpy("logits")
        got = client.infer("tc_ov", [infer_input(k, v) for k, v in inputs.items()]).as_numpy("logits")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        grpc_inputs = []
        for name, array in inputs.items():
            grpc_inputs.append(grpcclient.InferInput(name, list(array.shape), "INT64"))
            grpc_inputs[-1].set_data_from_numpy(array)
        got_grpc = client.infer("tc_ov", grpc_inputs).as_numpy("logits")
    np.testing.assert_allclose(got_grpc, want, rtol=1e-4, atol=1e-5)


def test_accelerated_config_is_served_unchanged(server: ModelsvcProcess) -> None:
    config = httpx.get(f"{server.base}/v2/models/tc_ov/config", timeout=10).json()
    assert config["backend"] == "onnxruntime"
    assert config["optimization"]["execution_accelerators"]["cpu_execution_accelerator"] == [{"name": "openvino"}]
    stats = server.model_stats("tc_ov")
    assert stats["inference_stats"]["success"]["count"] >= 1


def test_bad_openvino_models_are_unavailable_with_the_reason(server: ModelsvcProcess) -> None:
    index = {row["name"]: row for row in httpx.post(f"{server.base}/v2/repository/index", timeout=10).json()}
    assert index["bad_names"]["state"] == "UNAVAILABLE"
    assert "'logits'" in index["bad_names"]["reason"]
    assert index["bad_param"]["state"] == "UNAVAILABLE"
    assert "'NUM_STREAMS'" in index["bad_param"]["reason"]


def test_a_config_without_a_backend_line_is_read_as_openvino_from_its_model_xml(tmp_path: Path) -> None:
    """Triton's rule, as for model.onnx or model.pt: the model file (here default_model_filename) names the backend."""
    config = identity_config("named", extra='default_model_filename: "model.xml"').replace(BACKEND, "")
    write_ir(tmp_path, "named", om.identity("FP32", ["batch", "n"]), config)
    write_ir(tmp_path, "found", om.identity("FP32", ["batch", "n"]), identity_config("found").replace(BACKEND, ""))
    for name in ("named", "found"):
        source = ModelRepository(tmp_path).load(name)
        assert source.config.backend == "openvino", name


def test_an_ir_with_an_unnamed_output_fails_the_load_naming_the_model(tmp_path: Path) -> None:
    # ov.convert_model of a PyTorch module gives its outputs no tensor names, and ov.save_model keeps none
    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), None)
    xml = tmp_path / "m" / "1" / "model.xml"
    model = ov.Core().read_model(str(xml))
    model.outputs[0].get_tensor().set_names(set())
    ov.serialize(model, str(xml))
    config = ModelConfig(name="m", backend="openvino")
    with pytest.raises(ModelLoadError, match=r"model 'm': output 0 of '.*model.xml' has no tensor name"):
        get_backend(config).autocomplete(config, xml)


def test_uint64_beyond_31_bits_is_refused_not_wrapped(tmp_path: Path) -> None:
    # the CPU plugin computes UINT64 as signed 32-bit: 2**31 + 5 plus one came back as 2**64 - 2147483642
    x = ov.opset13.parameter([-1, 2], ov.Type.u64, name="INPUT0")
    y = ov.opset13.add(x, ov.opset13.constant(np.array([1], np.uint64)))
    y.output(0).get_tensor().set_names({"OUTPUT0"})
    (tmp_path / "m" / "1").mkdir(parents=True)
    ov.save_model(ov.Model([y.output(0)], [x], "m"), str(tmp_path / "m" / "1" / "model.xml"))
    (instance,) = load(tmp_path, "m")
    small = np.array([[2**31 - 2, 0]], np.uint64)
    np.testing.assert_array_equal(instance.execute({"INPUT0": small}, [])["OUTPUT0"], small + 1)
    with pytest.raises(InvalidArgument, match=r"input 'INPUT0' of model 'm': .*UINT64.*\[0, 2147483647\]"):
        instance.execute({"INPUT0": np.array([[2**31 + 5, 0]], np.uint64)}, [])


def test_closed_instances_let_their_compiled_model_go(tmp_path: Path) -> None:
    import gc
    import weakref

    write_ir(tmp_path, "m", om.identity("FP32", ["batch", "n"]), identity_config("m", extra=param("NUM_STREAMS", "2")))
    instances = load(tmp_path, "m")  # still referenced after close, as a scheduler holds its instances
    compiled = weakref.ref(instances[0]._compiled)  # type: ignore[attr-defined]
    for instance in instances:
        instance.close()
    gc.collect()
    assert compiled() is None


def test_a_config_that_leaves_out_a_model_input_fails_the_load(tmp_path: Path) -> None:
    # without auto-complete nothing would feed INPUT1: the request ran on whatever its memory held
    config = (
        f'name: "m"\n{BACKEND}max_batch_size: 0\ninput [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }} ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]\n'
    )
    write_ir(tmp_path, "m", om.add_sub([1, 4]), config)
    source = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("m")
    with pytest.raises(ConfigMismatchError, match=r"model 'm' has input 'INPUT1', which the configuration does not"):
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)


def test_a_request_without_an_optional_input_is_a_400_not_the_last_requests_data(tmp_path: Path) -> None:
    config = identity_config("m", mbs=0, dims="1, 4").replace(
        "input [ ", 'input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] optional: true }, '
    )
    write_ir(tmp_path, "m", om.add_sub([1, 4]), config)
    (instance,) = load(tmp_path, "m")
    x, y = np.ones((1, 4), np.float32), np.full((1, 4), 100, np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": x, "INPUT1": y}, ["OUTPUT0"])["OUTPUT0"], x + y)
    with pytest.raises(InvalidArgument, match=r"model 'm' needs input 'INPUT1'"):
        instance.execute({"INPUT0": x}, ["OUTPUT0"])  # OpenVINO would reuse the last request's INPUT1
