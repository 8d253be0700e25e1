"""loadtests/gpu/plan_engine_cuda.py without a GPU: it skips cleanly (exit 0, "SKIP: no CUDA") where cuda.bindings
or a GPU is missing, and its checks pass against the tests' host-memory stand-in of cudart, so that the run on a GPU
machine tests PlanEngine and not the script."""

from __future__ import annotations

import ctypes
import enum
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtests.gpu import plan_engine_cuda as script
from tests._trt_standin import ENGINE_MODULE, Memory, standin_cudart

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "loadtests" / "gpu" / "plan_engine_cuda.py"


def test_without_cuda_it_skips() -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=environment)
    if "SKIP" not in done.stdout and done.returncode == 0:
        pytest.skip("this machine has CUDA: the script really ran")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("SKIP: no CUDA ("), done.stdout
    assert done.stderr == ""


def _host_cudart() -> types.ModuleType:
    """The tests' stand-in cudart with what the script calls besides the engine's calls."""
    memory = Memory()
    rt = standin_cudart(memory)
    kinds = {"cudaMemcpyHostToDevice": 1, "cudaMemcpyDeviceToHost": 2, "cudaMemcpyDeviceToDevice": 3}
    vars(rt)["cudaMemcpyKind"] = enum.Enum("cudaMemcpyKind", kinds)
    memory_type: Any = enum.Enum("memory_type", {"cudaMemoryTypeHost": 1, "cudaMemoryTypeDevice": 2})
    success, no_memory = rt.cudaError_t.cudaSuccess, rt.cudaError_t.cudaErrorMemoryAllocation
    malloc = rt.cudaMalloc

    def limited_malloc(size: int) -> Any:
        return (no_memory, 0) if size > 1 << 40 else malloc(size)

    def attributes(pointer: int) -> Any:
        kind = memory_type.cudaMemoryTypeHost if pointer in memory.host else memory_type.cudaMemoryTypeDevice
        assert pointer in memory.host or pointer in memory.device
        return success, types.SimpleNamespace(type=kind)

    def memcpy(dst: int, src: int, count: int, kind: Any, stream: Any) -> Any:
        assert isinstance(stream, int) or type(stream).__name__ == "Stream"
        ctypes.memmove(dst, src, count)
        return (success,)

    vars(rt)["cudaMalloc"] = limited_malloc
    vars(rt)["cudaMemcpyAsync"] = memcpy
    vars(rt)["cudaPointerGetAttributes"] = attributes
    vars(rt)["cudaGetDeviceCount"] = lambda: (success, 1)
    vars(rt)["cudaMemGetInfo"] = lambda: (success, 1 << 30, 1 << 31)
    return rt


@pytest.fixture
def host_cudart(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    rt = _host_cudart()
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    vars(bindings)["runtime"] = rt
    vars(cuda)["bindings"] = bindings
    for name, module in {"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.runtime": rt}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # replaced by the script's
    try:
        yield rt
    finally:
        sys.modules.pop(ENGINE_MODULE, None)
        import modelsvc.backends.tensorrt

        vars(modelsvc.backends.tensorrt).pop("_tensorrt_engine", None)


def test_every_check_passes_against_host_memory(
    host_cudart: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("PASS")]
    assert len(lines) == 2 + 5 * len(script.DTYPES), out
    assert "HALF: only the output asked for copied back" in out
    assert out.rstrip().endswith("plan_engine_cuda: every check passed")


def test_a_failing_check_is_reported_and_fails_the_run(
    host_cudart: types.ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    success = host_cudart.cudaError_t.cudaSuccess
    monkeypatch.setattr(host_cudart, "cudaMemGetInfo", lambda: (success, 0, 1 << 31))  # "no memory free"
    assert script.main() == 1
    out = capsys.readouterr().out
    assert "FAIL  _check unpacks cudart's (error, value...) tuples: AssertionError" in out
    assert out.rstrip().endswith("plan_engine_cuda: 1 check(s) FAILED")


@pytest.fixture
def modelsvc_modules() -> Iterator[None]:
    """modelsvc's modules as they were, put back after a test that stands in for its packages."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "modelsvc"}
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "modelsvc"]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_the_checks_pass_with_modelsvc_s_packages_stood_in_for(
    host_cudart: types.ModuleType, modelsvc_modules: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on a GPU image without tritonclient or msgspec: only the engine's three modules are modelsvc's files."""
    assert script.run(host_cudart, stubs=True) == 0
    out = capsys.readouterr().out
    assert "imported with stand-ins for modelsvc's package imports (asked for missing)" in out
    assert "FAIL" not in out, out
    assert not hasattr(sys.modules["modelsvc.backends._base"], "__file__")  # the stand-in, not the file
    engine_file = ROOT / "modelsvc" / "backends" / "tensorrt" / "_tensorrt_engine.py"
    assert sys.modules[ENGINE_MODULE].__file__ == str(engine_file)
