"""ONNX Runtime's CUDA provider in an environment made with pip alone (shared/reviews/gpu-code.md, B3): the backend
calls ``onnxruntime.preload_dlls()`` once, before the first session that asks for CUDA, and never for a CPU-only
model; and the GPU test skips, not errors, where the provider did not load. Without a GPU: ONNX Runtime's provider
list and session are stood in for, the session itself runs on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime
import pytest

from modelsvc.backends.onnxruntime import _onnxruntime_options
from tests.backends import test_onnxruntime_gpu_options as gpu_options
from tests.backends.test_onnxruntime_gpu_options import FALLBACK, create

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What reached ONNX Runtime, in order: "preload", or ("session", provider names asked for)."""
    seen: list[Any] = []
    real = onnxruntime.InferenceSession

    def session(model: Any, options: Any = None, providers: Any = None, **kwargs: Any) -> Any:
        names = [p if isinstance(p, str) else p[0] for p in providers or []]
        seen.append(("session", names))
        return real(model, options, providers=[CPU], **kwargs)  # what a GPU build without its libraries does

    monkeypatch.setattr(_onnxruntime_options, "_preloaded", False, raising=False)
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: seen.append("preload"), raising=False)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    return seen


GPU_GROUP = "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]\n"


def test_the_cuda_libraries_are_preloaded_once_before_the_first_cuda_session(events: list[Any], tmp_path: Path) -> None:
    create(tmp_path, "cpu_only", "instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    assert "preload" not in events  # a CPU model loads no CUDA library
    assert events
    events.clear()
    create(tmp_path, "on_gpu", GPU_GROUP + FALLBACK)
    create(tmp_path, "on_gpu_too", GPU_GROUP + FALLBACK)
    cuda_sessions = [i for i, e in enumerate(events) if e != "preload" and CUDA in e[1]]
    assert len(cuda_sessions) == 4
    assert events.count("preload") == 1
    assert events.index("preload") < cuda_sessions[0]


def test_an_onnxruntime_without_preload_dlls_is_fine(
    events: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(onnxruntime, "preload_dlls")  # ORT before 1.21
    [instance, _] = create(tmp_path, "on_gpu", GPU_GROUP + FALLBACK)
    assert instance.device == "cpu"
    assert "preload" not in events


def test_a_failing_preload_is_a_warning(
    events: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fails() -> None:
        raise OSError("libcudnn.so.9: cannot open shared object file")

    monkeypatch.setattr(onnxruntime, "preload_dlls", fails)
    create(tmp_path, "on_gpu", GPU_GROUP + FALLBACK)
    assert any("preload_dlls() failed (libcudnn.so.9" in r.getMessage() for r in caplog.records)


def test_the_gpu_test_skips_where_the_cuda_provider_did_not_load(
    events: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU is visible and the GPU build lists CUDA, but its session runs on the CPU: a skip that says why."""
    monkeypatch.setattr(gpu_options, "visible_gpus", lambda: [0])
    with pytest.raises(pytest.skip.Exception, match="CUDA provider did not load here"):
        gpu_options._gpu_instance(tmp_path, "")
