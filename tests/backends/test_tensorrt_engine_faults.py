"""The known faults of the GPU-only ``PlanEngine`` (shared/reviews/gpu-code.md: A2, A3, B5 and the smaller ones),
each shown against the stand-in of ``tensorrt`` and cudart (``tests._trt_standin``) that has the real API's habit:

- only the outputs asked for are copied to the host, each straight into the array returned (A2);
- the process has one TensorRT logger, and each engine still gets TensorRT's error text (B5);
- ``set_optimization_profile_async`` raises on failure: a load error, and ``modelsvc compare``'s usual error (A3);
- every execution context runs with NVTX verbosity LAYER_NAMES_ONLY (plans are built DETAILED);
- a BF16 plan without ml_dtypes is a load error naming the extra;
- inputs that fit the profile but not each other (``infer_shapes`` raises) are a 400 naming them (issue 29).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelsvc.backends import ModelLoadError
from modelsvc.backends._shapes import InputsMismatch
from modelsvc.backends.tensorrt._tensorrt_spec import EngineTensor
from modelsvc.protocol import ErrorKind
from tests._trt_standin import INCOMPATIBLE, Memory, ProfilingVerbosity, Severity, engine_module
from tests.backends.test_tensorrt_backend import parse

D2H = "cudaMemcpyDeviceToHost"


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Memory]]:
    with engine_module(monkeypatch) as loaded:
        yield loaded


def _feeds(shape: tuple[int, int] = (4, 8)) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(1)
    return {name: rng.standard_normal(shape).astype(np.float32) for name in ("INPUT0", "INPUT1")}


def _instance(tmp_path: Path) -> Any:
    """One instance of model 'm' on GPU 0 through the TensorRT backend, its plan the stand-in's."""
    import modelsvc.backends

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"standin")
    config = parse('name: "m" instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]')
    backend = modelsvc.backends.BACKENDS["tensorrt"]()
    backend.autocomplete(config, plan)
    (instance,) = backend.create_instances(config, plan, 1)
    return instance


def test_only_the_outputs_asked_for_are_copied_to_the_host(standin: tuple[Any, Memory]) -> None:
    module, memory = standin
    engine = module.PlanEngine(b"standin", profile=0)
    feeds = _feeds()
    try:
        out = engine.infer(feeds, ["OUTPUT0"])
        assert list(out) == ["OUTPUT0"]
        np.testing.assert_array_equal(out["OUTPUT0"], feeds["INPUT0"] + feeds["INPUT1"])
        # one copy back, of OUTPUT0's 4 x 8 floats, straight into the array returned (no staging buffer, no copy)
        assert memory.copies(D2H) == [(4 * 8 * 4, out["OUTPUT0"].ctypes.data)]
        assert out["OUTPUT0"].flags.owndata
        # the data-dependent output still ran (TensorRT writes every output), it was only not copied back
        assert memory.contexts[0].allocators["NONZERO"].shape == (int((feeds["INPUT0"] > 0).sum()),)

        memory.calls.clear()
        only = engine.infer(feeds, ["NONZERO"])
        assert list(only) == ["NONZERO"]
        np.testing.assert_array_equal(only["NONZERO"], np.flatnonzero(feeds["INPUT0"] > 0))
        assert [size for size, _ in memory.copies(D2H)] == [only["NONZERO"].nbytes]

        memory.calls.clear()
        every = engine.infer(feeds)  # none named: every output, as before
        assert list(every) == ["OUTPUT0", "NONZERO"]
        assert len(memory.copies(D2H)) == 2
        with pytest.raises(ValueError, match=r"no output 'LOGITS' \(it has OUTPUT0, NONZERO\)"):
            engine.infer(feeds, ["LOGITS"])
    finally:
        engine.close()


def test_the_backend_asks_the_engine_for_the_requested_outputs_only(
    standin: tuple[Any, Memory], tmp_path: Path
) -> None:
    _, memory = standin
    instance = _instance(tmp_path)
    try:
        memory.calls.clear()
        out = instance.execute(_feeds((2, 4)), ["OUTPUT0"])
        assert list(out) == ["OUTPUT0"]
        assert [size for size, _ in memory.copies(D2H)] == [2 * 4 * 4]
    finally:
        instance.close()


def test_inputs_that_fit_the_profile_but_not_each_other_are_a_400_in_tensorrt_s_words(
    standin: tuple[Any, Memory], tmp_path: Path
) -> None:
    """infer_shapes raising (only an error code) is the request's fault: InputsMismatch naming both inputs and
    their shapes with what TensorRT logged; the engine then serves the next request."""
    instance = _instance(tmp_path)
    try:
        feeds = {**_feeds((2, 3)), "INPUT1": _feeds((2, 4))["INPUT1"]}
        with pytest.raises(InputsMismatch) as info:
            instance.execute(feeds, ["OUTPUT0"])
        assert info.value.kind is ErrorKind.INVALID_ARGUMENT
        message = str(info.value)
        assert message.startswith("inputs INPUT0 [2,3] and INPUT1 [2,4] do not fit model 'm': TensorRT: ")
        assert "dimensions not compatible for elementwise: [2, 3] and [2, 4]" in message
        assert "error code" not in message  # TensorRT's logged words, not the binding's bare code
        feeds = _feeds((2, 4))
        np.testing.assert_array_equal(
            instance.execute(feeds, ["OUTPUT0"])["OUTPUT0"], feeds["INPUT0"] + feeds["INPUT1"]
        )
    finally:
        instance.close()


def test_every_engine_gets_tensorrt_s_error_text_through_the_one_logger(standin: tuple[Any, Memory]) -> None:
    """The stand-in keeps the first logger it is given, as TensorRT does: with a logger per engine, the second
    engine's deserialization error went to the first engine's logger and its message had no TensorRT text."""
    module, memory = standin
    first = module.PlanEngine(b"standin")
    with pytest.raises(ModelLoadError) as info:
        module.PlanEngine(b"from elsewhere")
    assert "expecting library version 10.99 got 8.6.1.6" in str(info.value)
    first.close()
    del first
    gc.collect()  # the first engine gone: the logger TensorRT kept must still be alive and still deliver
    with pytest.raises(ModelLoadError, match=r"expecting library version 10\.99 got 8\.6\.1\.6"):
        module.PlanEngine(b"from elsewhere again")

    second = module.PlanEngine(b"standin")
    try:
        memory.execute_error = "IExecutionContext::enqueueV3: Error Code 1: Cuda Runtime (an illegal memory access)"
        with pytest.raises(RuntimeError, match=r"execute_async_v3 failed: .*an illegal memory access"):
            second.infer(_feeds())
    finally:
        second.close()
    import tensorrt

    assert tensorrt.process_logger(None) is module.shared_logger(tensorrt)


def test_a_logged_error_reaches_only_the_engine_that_caused_it(standin: tuple[Any, Memory]) -> None:
    module, _ = standin
    good = module.PlanEngine(b"standin")
    try:
        with pytest.raises(ModelLoadError) as info:
            module.PlanEngine(b"from elsewhere")
        assert str(info.value).count(INCOMPATIBLE) == 1
    finally:
        good.close()


def test_a_profile_that_cannot_be_selected_is_a_load_error(standin: tuple[Any, Memory]) -> None:
    """TensorRT's binding raises RuntimeError ("Error in set optimization profile async."); it never returns False."""
    module, memory = standin
    memory.profile_error = "IExecutionContext::setOptimizationProfileAsync: profile 1 is in use by another context"
    with pytest.raises(ModelLoadError) as info:
        module.PlanEngine(b"standin", profile=1)
    message = str(info.value)
    assert message.startswith("TensorRT could not select optimization profile 1: Error in set optimization profile")
    assert "profile 1 is in use by another context" in message
    assert memory.device == {}
    assert memory.host == {}
    assert sum(call[0] == "cudaStreamDestroy" for call in memory.calls) == 1  # the stream made for it is freed


def test_a_profile_error_is_the_backend_s_load_error(standin: tuple[Any, Memory], tmp_path: Path) -> None:
    import modelsvc.backends

    _, memory = standin
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"standin")
    config = parse('name: "m" instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]')
    memory.profile_error = "no such profile"
    with pytest.raises(ModelLoadError, match=r"model 'm' \('.*model.plan', GPU 0\): TensorRT could not select"):
        modelsvc.backends.BACKENDS["tensorrt"]().autocomplete(config, plan)


def test_contexts_run_with_layer_names_only_nvtx(standin: tuple[Any, Memory]) -> None:
    module, memory = standin
    engine = module.PlanEngine(b"standin", profile=1)
    try:
        assert [c.nvtx_verbosity for c in memory.contexts] == [ProfilingVerbosity.LAYER_NAMES_ONLY]
    finally:
        engine.close()


def test_a_bf16_tensor_without_ml_dtypes_is_a_load_error_naming_the_extra(
    standin: tuple[Any, Memory], monkeypatch: pytest.MonkeyPatch
) -> None:
    module, _ = standin
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes raises ImportError
    tensor = EngineTensor(name="logits", is_input=False, datatype="TYPE_BF16", dims=(-1, 2))
    with pytest.raises(ModelLoadError) as info:
        module._numpy_dtype(tensor)
    assert str(info.value) == (
        "tensor 'logits' is BF16, which needs ml_dtypes (numpy's bfloat16), not installed: "
        "pip install 'modelsvc[tensorrt]'"
    )


def test_the_stand_in_logs_through_the_first_logger_only(standin: tuple[Any, Memory]) -> None:
    """The stand-in's own habit, which the tests above rely on."""
    import tensorrt

    class Mine(tensorrt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            self.seen.append(msg)

    first, second = Mine(), Mine()
    tensorrt.Runtime(first)
    tensorrt.Runtime(second).deserialize_cuda_engine(b"x")
    assert (len(first.seen), second.seen) == (1, [])
    assert Severity.ERROR.name == "ERROR"
