"""Regression tests from the review of `modelsvc export` and `modelsvc inspect`: text files given to inspect,
and a failed export into a new repository. Each failed before its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelsvc.tools.inspect_model import InspectError, inspect_model
from tests._export_share import save_tiny_bert, shared_onnx_export
from tests._server import ROOT

CONFIG_PBTXT = """name: "m"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "out" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


# --- modelsvc inspect -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("config.pbtxt", CONFIG_PBTXT),  # the file a user most often points inspect at by mistake
        ("model.json", '{"name": "m"}\n'),
    ],
    ids=["config.pbtxt", "json"],
)
def test_inspect_of_a_text_file_is_an_inspect_error_not_a_traceback(tmp_path: Path, name: str, text: str) -> None:
    """onnx.load picks a text or JSON protobuf parser from the file's suffix; their ParseErrors are not
    DecodeError/ValueError, so `_inspect_onnx` lets them through and the CLI dies with a traceback (exit 1)."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InspectError, match="not an ONNX model"):
        inspect_model(path)
    done = subprocess.run(
        [sys.executable, "-m", "modelsvc", "inspect", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr


# --- modelsvc export ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxscript", reason="export needs modelsvc[export]")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_a_failed_check_leaves_no_model_repository_behind(tmp_path: Path, tiny_bert: Path) -> None:
    """README: "over --tolerance it exits 1 and writes nothing". export_model creates the repository folder
    with mkdir(parents=True) but, on failure, removes only the model's folder: a new, empty repository stays."""
    from modelsvc.tools.export import ExportCheckError, ExportOptions, export_model

    repository = tmp_path / "new-repository"
    # the point is what a failed check leaves: the torch.onnx program of tests/tools/test_export.py's identical tiny
    # BERT (same config, seed and defaults) is reused when that file ran first in this session
    with shared_onnx_export(), pytest.raises(ExportCheckError):
        export_model(
            ExportOptions(
                model=str(tiny_bert),
                model_repository=repository,
                model_name="strict",
                tolerance=0.0,  # ONNX Runtime and PyTorch always differ in the last bits
                log=lambda line: None,
            )
        )
    assert not (repository / "strict").exists()
    assert not repository.exists(), sorted(p.name for p in tmp_path.rglob("*"))
