"""``modelsvc compare`` on a plan whose engine cannot open: the command's usual error (exit 2, one line naming the
plan), never a traceback. The engine is the real ``PlanEngine`` against the stand-in of TensorRT and cudart
(``tests._trt_standin``), whose ``set_optimization_profile_async`` raises as TensorRT's binding does (A3)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelsvc._cli import main
from modelsvc.tools import onnx_models as om
from modelsvc.tools.compare import PlanRunner, SourceError
from modelsvc.tools.compare._plan import ENGINE_MODULE
from tests._trt_standin import Memory, engine_module


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Memory]]:
    with engine_module(monkeypatch) as loaded:
        yield loaded


@pytest.fixture
def sources(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "add_sub.onnx"
    onnx.save(om.add_sub(["batch", "n"]), model)
    plan = tmp_path / "add_sub.plan"
    plan.write_bytes(b"standin")
    return model, plan


def test_a_profile_that_cannot_be_selected_is_compare_s_usual_error(
    standin: tuple[Any, Memory], sources: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, memory = standin
    memory.profile_error = "setOptimizationProfileAsync: profile 1 is in use"
    model, plan = sources
    with pytest.raises(SourceError, match=r"add_sub\.plan: TensorRT could not select optimization profile 1"):
        PlanRunner(plan, profile=1)
    assert main(["compare", str(model), str(plan)]) == 2
    err = capsys.readouterr().err
    assert "TensorRT could not select optimization profile 0" in err
    assert "profile 1 is in use" in err
    assert "Traceback" not in err


def test_a_cuda_error_opening_the_plan_is_compare_s_usual_error(
    monkeypatch: pytest.MonkeyPatch, sources: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    class NoSuchGpu:
        def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
            raise RuntimeError("CUDA error cudaErrorInvalidDevice")

    module = types.ModuleType(ENGINE_MODULE)
    vars(module)["PlanEngine"] = NoSuchGpu
    monkeypatch.setitem(sys.modules, ENGINE_MODULE, module)
    model, plan = sources
    with pytest.raises(SourceError, match=r"add_sub\.plan: cannot open the plan on GPU 3: CUDA error"):
        PlanRunner(plan, device=3)
    assert main(["compare", str(model), str(plan)]) == 2
    err = capsys.readouterr().err
    assert "cannot open the plan on GPU 0: CUDA error cudaErrorInvalidDevice" in err
    assert "Traceback" not in err
