"""The PyTorch backend: Triton's naming rules, every datatype, strings, dict inputs, parameters, bad configs and
bad model files, request-time errors, instances side by side, in process (a real server and the process-wide
settings: tests/backends/test_pytorch_processes.py).

The models are tiny TorchScript modules scripted here. The contract every backend keeps (add_sub, identity, a config
that disagrees with the model) is in tests/backends/test_backend_contract.py."""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the pytorch backend needs modelsvc[pytorch]")

import ml_dtypes  # noqa: E402

from modelsvc.backends import ConfigMismatchError, InputsMismatch, ModelInstance, ModelLoadError, get_backend  # noqa: E402
from modelsvc.backends.pytorch._pytorch_spec import parse_options  # noqa: E402
from modelsvc.protocol import InternalError, InvalidArgument  # noqa: E402
from modelsvc.repository import ModelRepository  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# --- tiny TorchScript models ----------------------------------------------------------------------------------


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Identity(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0


class SubMul(torch.nn.Module):
    """Arguments named neither after the config nor INPUT__n: the config's names decide."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a - b, a * b


class DictSum(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] + 2 * inputs["y"]


class Upper(torch.nn.Module):
    def forward(self, text: list[str]) -> tuple[list[str], torch.Tensor]:
        lengths = [len(t) for t in text]
        return [t.upper() for t in text], torch.tensor(lengths, dtype=torch.int64)


class ReturnsDict(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": x}


class AsDouble(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


class Linear(torch.nn.Module):
    """Takes 4 features: a request of another width fails torch's matmul check."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class Fails(torch.nn.Module):
    """A model's own failure, whatever the inputs: a RuntimeError that is none of ATen's shape checks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > -1.0):
            raise RuntimeError("no weights yet")
        return x


class Heavy(torch.nn.Module):
    """Enough matrix work per call to see two instances overlap (torch releases the GIL in its ops)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(20):
            y = torch.tanh(y @ x)
        return y


def write_torchscript(repo: Path, name: str, module: torch.nn.Module, config: str, embedded: str | None = None) -> Path:
    """``repo/name/1/model.pt`` (``module`` scripted, in eval mode, carrying ``embedded`` as its config.pbtxt) and
    ``repo/name/config.pbtxt``."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    extra = {"config.pbtxt": embedded} if embedded is not None else {}
    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript; Triton's pytorch_libtorch serves it
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(module.eval())
        torch.jit.save(scripted, str(repo / name / "1" / "model.pt"), _extra_files=extra)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def tensors(specs: list[tuple[str, str, str]]) -> str:
    return ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [ {d} ] }}' for n, t, d in specs)


def cfg(name: str, inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]], extra: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "pytorch"\nmax_batch_size: 8\ninput [ {tensors(inputs)} ]\n'
        f"output [ {tensors(outputs)} ]\ninstance_group [ {{ kind: KIND_CPU }} ]\n{extra}\n"
    )


def load(repo: Path, name: str) -> list[ModelInstance]:
    source = ModelRepository(repo, gpus=()).load(name)
    created: list[ModelInstance] = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    return created


def one(repo: Path, name: str, module: torch.nn.Module, config: str, embedded: str | None = None) -> ModelInstance:
    write_torchscript(repo, name, module, config, embedded)
    return load(repo, name)[0]


def load_error(repo: Path, name: str) -> str:
    source = ModelRepository(repo, strict_model_config=True, gpus=()).load(name)
    with pytest.raises(ModelLoadError) as info:
        get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    return str(info.value)


def add_sub_config(name: str, extra: str = "") -> str:
    return cfg(name, [("INPUT0", "FP32", "-1"), ("INPUT1", "FP32", "-1")], [("OUTPUT0", "FP32", "-1")] * 1, extra)


# --- datatypes ------------------------------------------------------------------------------------------------

DATATYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_round_trips(tmp_path: Path, datatype: str) -> None:
    config = cfg("m", [("INPUT0", datatype, "-1")], [("OUTPUT0", datatype, "-1")])
    instance = one(tmp_path, "m", Identity(), config)
    array = (np.arange(12).reshape(3, 4) % 5).astype(DATATYPES[datatype])
    out = instance.execute({"INPUT0": array}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == array.dtype
    np.testing.assert_array_equal(out.astype(np.float64), array.astype(np.float64))


def test_unsupported_datatype_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    write_torchscript(tmp_path, "m", Identity(), cfg("m", [("INPUT0", "UINT16", "-1")], [("OUTPUT0", "UINT16", "-1")]))
    message = load_error(tmp_path, "m")
    assert "'INPUT0'" in message
    assert "model 'm'" in message
    assert "TYPE_UINT16" in message


def test_strings_travel_as_lists_of_str(tmp_path: Path) -> None:
    config = (
        'name: "m"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }, { name: "LENGTHS" data_type: TYPE_INT64 '
        "dims: [ -1 ] } ]\ninstance_group [ { kind: KIND_CPU } ]\n"
    )
    instance = one(tmp_path, "m", Upper(), config)
    text = np.array([b"abc", "\u00e9t\u00e9".encode()], dtype=np.object_)
    out = instance.execute({"TEXT": text}, [])
    assert list(out["UPPER"]) == [b"ABC", "\u00e9T\u00e9".encode()]  # TorchScript upper() is ASCII only
    np.testing.assert_array_equal(out["LENGTHS"], [3, 5])  # TorchScript len() counts UTF-8 bytes
    with pytest.raises(InvalidArgument, match=r"input 'TEXT'.*UTF-8"):
        instance.execute({"TEXT": np.array([b"\xff"], dtype=np.object_)}, [])


def test_a_string_tensor_with_two_dimensions_is_refused(tmp_path: Path) -> None:
    config = cfg("m", [("TEXT", "STRING", "-1")], [("UPPER", "STRING", "-1"), ("LENGTHS", "INT64", "-1")])
    write_torchscript(tmp_path, "m", Upper(), config)  # max_batch_size 8 + dims [-1]: two dimensions
    message = load_error(tmp_path, "m")
    assert "'TEXT'" in message
    assert "List[str]" in message


# --- naming ---------------------------------------------------------------------------------------------------


def test_inputs_named_after_forward_arguments_in_any_order(tmp_path: Path) -> None:
    inputs = [("INPUT1", "FP32", "-1"), ("INPUT0", "FP32", "-1")]
    instance = one(tmp_path, "m", AddSub(), cfg("m", inputs, [("OUTPUT0", "FP32", "-1"), ("OUTPUT1", "FP32", "-1")]))
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 5, np.float32)
    out = instance.execute({"INPUT0": a, "INPUT1": b}, [])
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)  # outputs in the config's order


def test_named_index_inputs_and_outputs(tmp_path: Path) -> None:
    inputs = [("INPUT__1", "FP32", "-1"), ("INPUT__0", "FP32", "-1")]
    outputs = [("OUTPUT__1", "FP32", "-1"), ("OUTPUT__0", "FP32", "-1")]
    instance = one(tmp_path, "m", SubMul(), cfg("m", inputs, outputs))
    a, b = np.full((2, 2), 3, np.float32), np.full((2, 2), 2, np.float32)
    out = instance.execute({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
    assert list(out) == ["OUTPUT__0", "OUTPUT__1"]
    np.testing.assert_array_equal(out["OUTPUT__0"], a - b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a * b)


def test_other_names_follow_the_config_order(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    inputs = [("first", "FP32", "-1"), ("second", "FP32", "-1")]
    instance = one(tmp_path, "m", SubMul(), cfg("m", inputs, [("diff", "FP32", "-1"), ("prod", "FP32", "-1")]))
    a, b = np.full((1, 2), 7, np.float32), np.full((1, 2), 2, np.float32)
    out = instance.execute({"first": a, "second": b}, [])
    np.testing.assert_array_equal(out["diff"], a - b)
    np.testing.assert_array_equal(out["prod"], a * b)
    assert "configuration's order" in caplog.text


def test_a_dict_input_gets_every_input_by_name(tmp_path: Path) -> None:
    config = cfg("m", [("x", "FP32", "-1"), ("y", "FP32", "-1")], [("z", "FP32", "-1")])
    instance = one(tmp_path, "m", DictSum(), config)
    x, y = np.ones((2, 2), np.float32), np.full((2, 2), 3, np.float32)
    np.testing.assert_array_equal(instance.execute({"x": x, "y": y}, [])["z"], x + 2 * y)


@pytest.mark.parametrize(
    ("module", "inputs", "outputs", "tensor", "words"),
    [
        (AddSub, ["INPUT0", "INPUT1", "INPUT2"], ["OUTPUT0"], "INPUT2", "3 inputs"),
        (AddSub, ["INPUT0"], ["OUTPUT0"], None, "argument 'INPUT1' gets no input"),
        (SubMul, ["INPUT__0", "INPUT__5"], ["OUTPUT__0"], "INPUT__5", "argument 5"),
        (SubMul, ["INPUT__0", "x__0"], ["OUTPUT__0"], "x__0", "both name argument 0"),
        (AddSub, ["INPUT1", "other"], ["OUTPUT0"], "INPUT1", "argument 1"),
        (AddSub, ["INPUT0", "INPUT1"], ["OUTPUT__0", "OUTPUT__2"], "OUTPUT__2", "a tuple of 2"),
        (Identity, ["INPUT0"], ["OUTPUT0", "OUTPUT1"], "OUTPUT1", "one value"),
    ],
)
def test_a_config_that_does_not_fit_forward_is_refused(
    tmp_path: Path, module: type, inputs: list[str], outputs: list[str], tensor: str | None, words: str
) -> None:
    config = cfg("m", [(n, "FP32", "-1") for n in inputs], [(n, "FP32", "-1") for n in outputs])
    write_torchscript(tmp_path, "m", module(), config)
    source = ModelRepository(tmp_path, strict_model_config=True, gpus=()).load("m")  # read, not completed
    with pytest.raises(ConfigMismatchError) as info:
        get_backend(source.config).autocomplete(source.config, source.artifact(1))
    assert "model 'm'" in str(info.value)
    assert words in str(info.value)
    if tensor is not None:
        assert f"'{tensor}'" in str(info.value)
        assert info.value.tensor == tensor


def test_a_forward_that_returns_a_dict_is_refused(tmp_path: Path) -> None:
    write_torchscript(tmp_path, "m", ReturnsDict(), cfg("m", [("x", "FP32", "-1")], [("y", "FP32", "-1")]))
    assert "returns Dict[str, Tensor]" in load_error(tmp_path, "m")


# --- bad files and configs ------------------------------------------------------------------------------------


def test_a_file_that_is_not_torchscript_is_refused_naming_it(tmp_path: Path) -> None:
    write_torchscript(tmp_path, "m", Identity(), cfg("m", [("INPUT0", "FP32", "-1")], [("OUTPUT0", "FP32", "-1")]))
    artifact = tmp_path / "m" / "1" / "model.pt"
    for content in (b"not a model", None):
        if content is None:
            torch.save(Identity(), str(artifact))  # a pickled nn.Module, not TorchScript
        else:
            artifact.write_bytes(content)
        message = load_error(tmp_path, "m")
        assert str(artifact) in message
        assert "not a TorchScript model" in message


def test_a_config_without_outputs_says_what_is_missing(tmp_path: Path) -> None:
    config = 'name: "m"\nbackend: "pytorch"\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    write_torchscript(tmp_path, "m", Identity(), config)
    with pytest.raises(Exception, match=r"no output section.*must list every input and output"):
        ModelRepository(tmp_path, gpus=()).load("m")


def test_an_embedded_config_completes_and_checks_the_config(tmp_path: Path) -> None:
    embedded = 'max_batch_size: 4 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ] ' + (
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ]'
    )
    write_torchscript(tmp_path, "m", Identity(), 'backend: "pytorch"\n', embedded)
    source = ModelRepository(tmp_path, gpus=()).load("m")
    assert source.config.max_batch_size == 4
    assert source.config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in source.config.input] == [("INPUT0", [3])]
    bad = 'backend: "pytorch"\nmax_batch_size: 4\ninput [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
    write_torchscript(tmp_path, "bad", Identity(), bad, embedded)
    with pytest.raises(Exception, match="'INPUT0' of model 'bad'"):
        ModelRepository(tmp_path, gpus=()).load("bad")


def test_a_model_file_that_carries_its_config_needs_no_config_pbtxt(tmp_path: Path) -> None:
    embedded = 'input [ { name: "INPUT0" data_type: TYPE_INT16 dims: [ 2 ] } ] ' + (
        'output [ { name: "OUTPUT0" data_type: TYPE_INT16 dims: [ 2 ] } ]'
    )
    write_torchscript(tmp_path, "m", Identity(), "", embedded)
    (tmp_path / "m" / "config.pbtxt").unlink()
    (instance,) = load(tmp_path, "m")  # the backend comes from model.pt, the tensors from the file
    array = np.array([3, -4], np.int16)
    np.testing.assert_array_equal(instance.execute({"INPUT0": array}, [])["OUTPUT0"], array)


@pytest.mark.gpu
def test_a_gpu_instance_runs_on_cuda(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch built with CUDA and an NVIDIA GPU")
    gpu = "{ kind: KIND_GPU gpus: [ 0 ] }"
    extra = param("ENABLE_CACHE_CLEANING", "true")
    write_torchscript(tmp_path, "m", AddSub(), add_sub_config("m", extra).replace("{ kind: KIND_CPU }", gpu))
    bf16 = cfg("bf16", [("INPUT0", "BF16", "-1")], [("OUTPUT0", "BF16", "-1")]).replace("{ kind: KIND_CPU }", gpu)
    write_torchscript(tmp_path, "bf16", Identity(), bf16)
    source = ModelRepository(tmp_path).load("m")
    (instance,) = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    assert instance.device == "gpu:0"
    assert "cuda:0" in instance.providers[0]
    a, b = np.full((2, 3), 4, np.float32), np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])["OUTPUT0"], a + b)
    with pytest.raises(InternalError):  # shapes that do not fit each other, on the GPU
        instance.execute({"INPUT0": a, "INPUT1": np.ones((2, 4), np.float32)}, [])
    source = ModelRepository(tmp_path).load("bf16")
    (half,) = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    array = np.linspace(-1, 1, 8).astype(ml_dtypes.bfloat16).reshape(2, 4)
    np.testing.assert_array_equal(half.execute({"INPUT0": array}, [])["OUTPUT0"], array)
    instance.close()
    half.close()


def test_kind_gpu_without_cuda_is_refused(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the refusal where PyTorch sees no CUDA device")
    config = add_sub_config("m").replace("KIND_CPU", "KIND_GPU")
    write_torchscript(tmp_path, "m", AddSub(), config)
    assert "asks for GPU 0, but PyTorch sees no CUDA device" in load_error(tmp_path, "m")


# --- parameters -----------------------------------------------------------------------------------------------


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


@pytest.mark.parametrize(
    ("key", "value"),
    [("DISABLE_OPTIMIZED_EXECUTION", "maybe"), ("INFERENCE_MODE", ""), ("INTRA_OP_THREAD_COUNT", "two")],
)
def test_a_bad_parameter_value_is_refused_naming_the_key(tmp_path: Path, key: str, value: str) -> None:
    write_torchscript(tmp_path, "m", AddSub(), add_sub_config("m", param(key, value)))
    message = load_error(tmp_path, "m")
    assert f"'{key}'" in message
    assert "model 'm'" in message


def test_parameters_are_read_as_triton_reads_them(tmp_path: Path) -> None:
    extra = "".join(
        param(k, v)
        for k, v in [
            ("DISABLE_OPTIMIZED_EXECUTION", "true"),
            ("INFERENCE_MODE", "false"),
            ("ENABLE_WEIGHT_SHARING", "on"),
            ("ENABLE_CACHE_CLEANING", "1"),
            ("ENABLE_JIT_PROFILING", "FALSE"),  # read here; set by create_instances only (process-wide)
            ("INTRA_OP_THREAD_COUNT", "0"),
        ]
    )
    source_text = add_sub_config("m", extra).replace("{ kind: KIND_CPU }", "{ kind: KIND_CPU count: 2 }")
    write_torchscript(tmp_path, "m", AddSub(), source_text)
    source = ModelRepository(tmp_path, gpus=()).load("m")
    options = parse_options(source.config)
    assert (options.optimized_execution, options.inference_mode, options.weight_sharing) == (False, False, True)
    assert (options.cache_cleaning, options.jit_profiling, options.intra_op_threads) == (True, False, None)
    source.config.parameters.pop("ENABLE_JIT_PROFILING")  # process-wide: not in the test process
    created = get_backend(source.config).create_instances(source.config, source.artifact(1), 1)
    assert created[0]._module is created[1]._module  # type: ignore[attr-defined]  # weights shared
    a = np.ones((1, 2), np.float32)
    np.testing.assert_array_equal(created[0].execute({"INPUT0": a, "INPUT1": a}, [])["OUTPUT0"], a + a)


def test_the_module_auto_complete_loaded_serves_the_first_cpu_instance(tmp_path: Path) -> None:
    write_torchscript(tmp_path, "m", AddSub(), add_sub_config("m").replace("{ kind: KIND_CPU }", "{ count: 2 }"))
    source = ModelRepository(tmp_path, gpus=()).load("m")  # auto-complete reads the file once
    backend = get_backend(source.config)
    probed = [module for module, _ in backend._probes.values()]  # type: ignore[attr-defined]
    first, second = backend.create_instances(source.config, source.artifact(1), 1)
    assert first._module in probed  # type: ignore[attr-defined]  # not read again
    assert second._module is not first._module  # type: ignore[attr-defined]  # no weight sharing: its own
    assert not any(module is first._module for module, _ in backend._probes.values())  # type: ignore[attr-defined]


# --- request-time errors and instances side by side -----------------------------------------------------------


def test_inputs_that_do_not_fit_each_other_are_invalid_in_torch_s_words(tmp_path: Path) -> None:
    """ATen's shape checks (a plain RuntimeError) are the request's fault, a 400 naming the inputs (issue 29);
    one input whose shape the module cannot take (a matmul) says so too."""
    instance = one(tmp_path, "m", AddSub(), add_sub_config("m"))
    with pytest.raises(InputsMismatch) as info:
        instance.execute({"INPUT0": np.ones((2, 3), np.float32), "INPUT1": np.ones((2, 4), np.float32)}, [])
    assert str(info.value) == (
        "inputs INPUT0 [2,3] and INPUT1 [2,4] do not fit model 'm': "
        "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
    )
    linear = one(tmp_path, "lin", Linear(), cfg("lin", [("x", "FP32", "-1")], [("y", "FP32", "-1")]))
    with pytest.raises(InputsMismatch, match=r"^input x \[2,3\] does not fit model 'lin': mat1 and mat2 shapes"):
        linear.execute({"x": np.ones((2, 3), np.float32)}, [])


def test_a_model_s_own_runtime_error_stays_an_internal_error(tmp_path: Path) -> None:
    instance = one(tmp_path, "m", Fails(), cfg("m", [("x", "FP32", "-1")], [("y", "FP32", "-1")]))
    with pytest.raises(
        InternalError, match=r"(?s)PyTorch execute failure in instance 'm_0' of model 'm'.*no weights yet"
    ):
        instance.execute({"x": np.ones((2, 3), np.float32)}, [])


def test_a_returned_dtype_that_differs_from_the_config_is_an_internal_error(tmp_path: Path) -> None:
    instance = one(tmp_path, "m", AsDouble(), cfg("m", [("x", "FP32", "-1")], [("y", "FP32", "-1")]))
    with pytest.raises(InternalError, match=r"output 'y' of model 'm'.*TYPE_FP32, forward\(\) returned TYPE_FP64"):
        instance.execute({"x": np.ones((1, 2), np.float32)}, [])


def test_two_instances_run_side_by_side(tmp_path: Path) -> None:
    config = cfg("m", [("x", "FP32", "64")], [("y", "FP32", "64")]).replace("KIND_CPU", "KIND_CPU count: 2")
    write_torchscript(tmp_path, "m", Heavy(), config)
    first, second = load(tmp_path, "m")
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    want = first.execute({"x": x}, [])["y"]
    barrier = threading.Barrier(2)

    def run(instance: ModelInstance) -> np.ndarray[Any, Any]:
        barrier.wait()
        result: np.ndarray[Any, Any] = instance.execute({"x": x}, [])["y"]
        return result

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, [first, second]))
    for result in results:
        np.testing.assert_allclose(result, want, rtol=1e-5)
