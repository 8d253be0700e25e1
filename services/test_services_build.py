"""`python -m services.build`: what is missing gets built (the model exported once, then copied), and a
second run writes nothing; the backend chosen by the CPU; another backend's config is the committed one with
its backend line swapped, and swapping back gives the committed text byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from services import build
from tests._server import ROOT


def test_missing_files_are_copied_from_the_built_model_without_exporting_again(built, tmp_path):
    # a tree where doc_classifier's model is built and everything else is missing
    source = build.model_file("doc_classifier")
    target = build.model_file("doc_classifier", tmp_path)
    target.parent.mkdir(parents=True)
    os.link(source, target)
    for service in build.SERVICES:
        config = build.model_file(service).parents[1] / "config.pbtxt"
        (build.model_file(service, tmp_path).parents[1]).mkdir(parents=True, exist_ok=True)
        shutil.copy(config, build.model_file(service, tmp_path).parents[1] / "config.pbtxt")
    assert build.model_file("embedder", tmp_path) in build.missing(tmp_path)

    said: list[str] = []
    written = build.build(say=said.append, root=tmp_path, backend="onnxruntime")
    assert not any("exporting" in line for line in said), said  # copied, not exported
    assert build.missing(tmp_path) == []
    assert build.model_file("embedder", tmp_path) in written
    assert build.model_file("embedder", tmp_path).read_bytes() == source.read_bytes()
    assert (build.tokenizer_dir("embedder", tmp_path) / "tokenizer.json").is_file()
    assert not list(tmp_path.rglob(".*.partial"))
    assert build.build(say=said.append, root=tmp_path, backend="onnxruntime") == []  # nothing left to do


def test_the_command_says_everything_is_built(built):
    done = subprocess.run(
        [sys.executable, "-m", "services.build"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "everything is built" in done.stdout


def test_auto_picks_by_the_cpu_flags():
    assert build.choose("auto", cpuinfo="flags\t: fpu avx2 fma") == ("onnxruntime", "fp32")
    assert build.choose("auto", cpuinfo="flags\t: avx512f amx_bf16 amx_tile") == ("openvino", "bf16")
    assert build.choose("auto", cpuinfo="flags\t: avx512f avx512_bf16") == ("openvino", "bf16")
    assert build.choose("auto", "int8", cpuinfo="flags\t: avx2") == ("openvino", "int8")
    assert build.choose("auto", "bf16", cpuinfo="flags\t: avx2") == ("openvino", "bf16")
    assert build.choose("auto", "fp32", cpuinfo="flags\t: amx_bf16") == ("onnxruntime", "fp32")
    assert build.choose("pytorch") == ("pytorch", "fp32")
    assert build.choose("openvino", "int8") == ("openvino", "int8")


@pytest.mark.parametrize(
    ("backend", "precision", "field", "parameter"),
    [
        ("onnxruntime", "fp32", ("backend", "onnxruntime"), None),
        ("onnxruntime", "int8", ("backend", "onnxruntime"), None),
        ("openvino", "fp32", ("backend", "openvino"), None),
        ("openvino", "bf16", ("backend", "openvino"), ("HINT_BF16", "YES")),
        ("openvino", "int8", ("backend", "openvino"), None),
        ("pytorch", "fp32", ("platform", "pytorch_libtorch"), None),
    ],
)
def test_another_backends_config_is_the_committed_one_swapped(backend, precision, field, parameter):
    for service in build.SERVICES:
        committed = build.config_file(service).read_text(encoding="utf-8")
        text = build.config_text(committed, backend, precision)
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert getattr(config, field[0]) == field[1]
        assert config.backend if field[0] == "backend" else not config.backend
        committed_config = text_format.Parse(committed, model_config_pb2.ModelConfig())
        assert config.input == committed_config.input
        assert config.output == committed_config.output
        assert config.dynamic_batching == committed_config.dynamic_batching
        extra = {k: v.string_value for k, v in config.parameters.items() if k not in committed_config.parameters}
        assert extra == (dict([parameter]) if parameter else {})
        assert build.committed_text(text) == committed  # the default build restores it byte for byte
        assert build.config_text(text, "onnxruntime", "fp32") == committed
        assert build.config_text(text, backend, precision) == text  # idempotent


def test_missing_follows_the_backend_the_config_names(tmp_path):
    for service in build.SERVICES:
        config = build.config_file(service, tmp_path)
        config.parent.mkdir(parents=True)
        config.write_text(build.config_text(build.config_file(service).read_text(), "openvino", "int8"))
    assert build.built_backend("embedder", tmp_path) == "openvino"
    assert build.model_file("embedder", tmp_path).name == "model.xml"
    names = {p.name for p in build.missing(tmp_path) if p.parent.name == "1"}
    assert names == {"model.xml", "model.bin"}
