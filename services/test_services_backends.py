"""The example services' parity checks, the ones ``python -m services.build`` runs before it writes, on the real
MiniLM served by the other backends: OpenVINO (the built ONNX file, ``backend: "openvino"``) and PyTorch (MiniLM
traced to TorchScript by ``modelsvc export --format torchscript``). ONNX Runtime is what every other test of the
services runs on. Each passes when the embedder keeps cosine >= 0.999 with sentence-transformers and the
doc_classifier labels every test document as documents.json says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services import build


def _repository(tmp_path: Path, backend: str) -> Path:
    """A scratch model repository with the services' config for ``backend`` (the committed one, its backend line
    swapped as services.build does), not yet holding a model file."""
    repository = tmp_path / "model_repository"
    (repository / build.MODEL_NAME / "1").mkdir(parents=True)
    committed = build.source_config(build.SERVICES[0]).read_text(encoding="utf-8")
    config = build.config_text(committed, backend, "fp32")
    if backend == "openvino":  # the ONNX file as it is: OpenVINO reads ONNX Runtime's fused operators
        config += 'default_model_filename: "model.onnx"\n'
    (repository / build.MODEL_NAME / "config.pbtxt").write_text(config, encoding="utf-8")
    return repository


def _check(repository: Path) -> list[str]:
    said: list[str] = []
    build.check_parity(repository, said.append)  # SystemExit naming what broke
    return said


def test_openvino_serves_the_services_with_parity(built: None, tmp_path: Path) -> None:
    pytest.importorskip("openvino", reason="needs modelsvc[openvino]")
    repository = _repository(tmp_path, "openvino")
    os.symlink(build.model_file("embedder", backend="onnxruntime"), repository / build.MODEL_NAME / "1" / "model.onnx")
    said = _check(repository)
    assert any("labels every test document" in line for line in said), said


def test_pytorch_serves_the_services_with_parity(built: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs modelsvc[pytorch]")
    repository = _repository(tmp_path, "pytorch")
    build._export(build._source(), repository, "pytorch", "fp32", lambda line: None)
    assert (repository / build.MODEL_NAME / "1" / "model.pt").is_file()
    said = _check(repository)
    assert any("labels every test document" in line for line in said), said
