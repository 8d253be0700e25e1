"""The process's one TensorRT logger (``modelsvc.backends.tensorrt._tensorrt_logger``), shared by the runtime and the
builder: captures per call and per thread, the builder's own lists, and a build after an engine (TensorRT keeps
the first logger it was given) still reporting TensorRT's error text."""

from __future__ import annotations

import logging
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from modelsvc.backends.tensorrt import _tensorrt_logger as tl
from modelsvc.tools.trt import _builder
from modelsvc.tools.trt._errors import BuildError
from modelsvc.tools.trt._shapes import ShapeRange
from tests._trt_standin import ILogger, Memory, Severity, standin_tensorrt


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = standin_tensorrt(Memory())
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    return module


def test_one_logger_per_process(trt: Any) -> None:
    assert tl.shared_logger(trt) is tl.shared_logger(trt)
    assert isinstance(tl.shared_logger(trt), ILogger)


def test_a_capture_takes_its_thread_s_messages(trt: Any, caplog: pytest.LogCaptureFixture) -> None:
    log = tl.shared_logger(trt)
    other: list[tl.Capture] = []
    started, release = threading.Event(), threading.Event()

    def elsewhere() -> None:
        with tl.capture() as taken:
            other.append(taken)
            started.set()
            release.wait(10)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    started.wait(10)
    with caplog.at_level(logging.DEBUG, logger="modelsvc.backends.tensorrt"):
        with tl.capture() as mine:
            log.log(Severity.ERROR, "mine failed")
            log.log(Severity.WARNING, "mine warned")
            log.log(Severity.INFO, "mine said")
        release.set()
        thread.join(10)
        log.log(Severity.ERROR, "nobody's")
    assert (mine.errors, mine.warnings) == (["mine failed"], ["mine warned"])
    assert (other[0].errors, other[0].warnings) == ([], [])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "TensorRT: mine failed"),
        ("WARNING", "TensorRT: mine warned"),
        ("DEBUG", "TensorRT: mine said"),
        ("ERROR", "TensorRT: nobody's"),
    ]


def test_a_message_from_a_thread_without_a_capture_goes_to_every_open_one(trt: Any) -> None:
    log = tl.shared_logger(trt)
    with tl.capture() as first, tl.capture(forward=False) as second:
        thread = threading.Thread(target=log.log, args=(Severity.ERROR, "from TensorRT's own thread"))
        thread.start()
        thread.join(10)
    assert first.errors == second.errors == ["from TensorRT's own thread"]


def test_collect_points_the_scope_at_the_caller_s_lists(trt: Any, caplog: pytest.LogCaptureFixture) -> None:
    errors: list[str] = []
    warnings: list[str] = []

    @tl.scoped
    def build() -> Any:
        log = tl.shared_logger(trt)
        log.log(Severity.WARNING, "before collect")
        got = tl.collect(trt, errors, warnings)
        log.log(Severity.ERROR, "after collect")
        return got

    with caplog.at_level(logging.DEBUG, logger="modelsvc.backends.tensorrt"):
        assert build() is tl.shared_logger(trt)
        tl.shared_logger(trt).log(Severity.ERROR, "after the build")
    assert (errors, warnings) == (["after collect"], ["before collect"])
    assert [r.getMessage() for r in caplog.records] == ["TensorRT: after the build"]  # the build's are its own
    with pytest.raises(RuntimeError, match="outside a function wrapped with @scoped"):
        tl.collect(trt, errors, warnings)


class _Config:
    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def add_optimization_profile(self, profile: Any) -> int:
        self.logger.log(Severity.ERROR, "IOptimizationProfile: max dimensions of input_ids are below min")
        return -1


class _Builder:
    def __init__(self, trt: Any, logger: Any) -> None:
        self.logger = trt.process_logger(logger)  # TensorRT's: the first logger given in the process

    def create_network(self, *flags: int) -> Any:
        return types.SimpleNamespace()

    def create_builder_config(self) -> _Config:
        return _Config(self.logger)

    def create_optimization_profile(self) -> Any:
        return types.SimpleNamespace(set_shape=lambda *args: None)


def test_a_build_after_an_engine_still_reports_tensorrt_s_error(trt: Any) -> None:
    """An engine of this process gave TensorRT its logger first; with a logger of its own, the builder's error went
    there and the build's message said nothing of TensorRT's."""
    trt.Runtime(tl.shared_logger(trt))  # as a PlanEngine loaded earlier does
    vars(trt)["BuilderFlag"] = types.SimpleNamespace(TF32=1)  # TensorRT 11's: no precision flags
    vars(trt)["Builder"] = lambda logger: _Builder(trt, logger)
    parser = types.SimpleNamespace(parse_from_file=lambda path: True)
    vars(trt)["OnnxParser"] = lambda network, logger: parser
    profile = {"input_ids": ShapeRange((1, 1), (4, 8), (8, 16))}
    with pytest.raises(BuildError) as info:
        _builder.build_serialized(Path("m.onnx"), [profile], _builder.BuilderSettings(), print)
    assert "TensorRT refused profile 0" in str(info.value)
    assert "max dimensions of input_ids are below min" in str(info.value)
