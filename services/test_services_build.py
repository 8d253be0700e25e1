"""`python -m services.build`: what is missing gets built (the model exported once, then copied), and a
second run writes nothing; the backend chosen per service by the CPU among the backends installed; another
backend's config is the tracked one with its backend line swapped, and swapping back gives the tracked text byte
for byte; everything the build writes is ignored by git."""

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
    source = build.model_file("embedder")  # onnxruntime fp32 on every CPU
    target = build.model_file("doc_classifier", tmp_path)
    target.parent.mkdir(parents=True)
    os.link(source, target)
    for service in build.SERVICES:
        build.config_file(service, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(build.source_config(service), build.source_config(service, tmp_path))
        build.config_file(service, tmp_path).write_text(build.wanted_config(service, "onnxruntime", "fp32", tmp_path))
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


def test_auto_picks_per_service_by_the_cpu_flags():
    def every(backend: str) -> bool:
        return True

    avx2, amx, zen4 = "flags\t: fpu avx2 fma", "flags\t: avx512f amx_bf16 amx_tile", "flags\t: avx512f avx512_bf16"
    for service in build.SERVICES:
        assert build.choose(service, cpuinfo=avx2, available=every) == ("onnxruntime", "fp32")
        assert build.choose(service, "auto", "int8", cpuinfo=avx2) == ("openvino", "int8")
        assert build.choose(service, "auto", "bf16", cpuinfo=avx2) == ("openvino", "bf16")
        assert build.choose(service, "auto", "fp32", cpuinfo=amx) == ("onnxruntime", "fp32")
        assert build.choose(service, "pytorch") == ("pytorch", "fp32")
        assert build.choose(service, "openvino", "int8") == ("openvino", "int8")
    # the classifier takes bf16 where the CPU has it; the embedder stays fp32 on every CPU (one fleet, one numerics)
    for flags in (amx, zen4):
        assert build.choose("doc_classifier", cpuinfo=flags, available=every) == ("openvino", "bf16")
        assert build.choose("embedder", cpuinfo=flags, available=every) == ("onnxruntime", "fp32")


#: /proc/cpuinfo flags of this project's three kinds of CPU (trimmed to what matters and a few around it)
AMX_XEON = "flags\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx_vnni"
AVX2_EPYC = "flags\t: fpu avx2 fma sse4_2"
VNNI_EPYC = "flags\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16"


def test_auto_builds_the_classifier_at_calibrated_int8_where_the_cpu_has_int8_dot_products():
    """AMX Xeons and AVX-512 VNNI EPYCs: openvino int8 for the classifier (its labels and cosine allow it, checked at
    build); AVX2-only EPYCs: onnxruntime fp32 (int8 was not measured faster there). The embedder stays fp32."""
    def every(backend: str) -> bool:
        return True

    assert build.choose("doc_classifier", cpuinfo=AMX_XEON, available=every) == ("openvino", "int8")
    assert build.choose("doc_classifier", cpuinfo=VNNI_EPYC, available=every) == ("openvino", "int8")
    assert build.choose("doc_classifier", cpuinfo=AVX2_EPYC, available=every) == ("onnxruntime", "fp32")
    for flags in (AMX_XEON, VNNI_EPYC, AVX2_EPYC):
        assert build.choose("embedder", cpuinfo=flags, available=every) == ("onnxruntime", "fp32")
        assert build.choose("embedder", "auto", "int8", cpuinfo=flags) == ("openvino", "int8")  # asked for: offered
    # bf16 without int8 dot products (no such CPU here, but the flags are separate)
    bf16_only = "flags\t: avx512f avx512_bf16"
    assert build.choose("doc_classifier", cpuinfo=bf16_only, available=every) == ("openvino", "bf16")
    assert build.MIN_COSINE["int8"] == 0.99
    assert build.MIN_COSINE["bf16"] == build.MIN_COSINE["fp32"] == 0.999


def test_auto_chooses_only_among_installed_backends_and_says_what_it_would_choose():
    def no_openvino(backend: str) -> bool:
        return backend != "openvino"

    zen4 = "flags\t: avx512f avx512_bf16 avx512_vnni"
    chosen = {s: build.choose(s, cpuinfo=zen4, available=no_openvino) for s in build.SERVICES}
    assert chosen == {"doc_classifier": ("onnxruntime", "fp32"), "embedder": ("onnxruntime", "fp32")}
    (line,) = build.hints(chosen, zen4)
    assert "doc_classifier: openvino int8 would be faster on this CPU (int8 dot products)" in line
    assert "pip install -e '.[openvino]'" in line
    assert build.hints(chosen, "flags\t: avx2") == []


def test_auto_on_a_bf16_cpu_without_openvino_builds_onnxruntime_for_both(built, tmp_path):
    """``python -m services.build`` as a README reader on an AVX-512 BF16 machine runs it: OpenVINO is not in the
    main command's extras, so auto builds ONNX Runtime fp32 for both services and names the extra for more."""
    onnx = build.model_file("embedder", backend="onnxruntime")
    for service in build.SERVICES:
        build.model_file(service, tmp_path, "onnxruntime").parent.mkdir(parents=True)
        shutil.copy(build.source_config(service), build.source_config(service, tmp_path))
    os.link(onnx, build.model_file("embedder", tmp_path, "onnxruntime"))
    build.config_file("embedder", tmp_path).write_text(build.wanted_config("embedder", "onnxruntime", "fp32"))

    said: list[str] = []
    written = build.build(
        say=said.append, root=tmp_path, cpuinfo="flags\t: avx512f avx512_bf16", available=lambda b: b != "openvino"
    )
    assert build.missing(tmp_path) == []
    assert not any("exporting" in line for line in said), said  # the embedder's onnxruntime model is copied
    assert any("doc_classifier: openvino bf16 would be faster" in line for line in said), said
    for service in build.SERVICES:
        assert build.built_backend(service, tmp_path) == "onnxruntime"
        assert build.config_file(service, tmp_path).read_text() == build.source_config(service).read_text()
    assert build.model_file("doc_classifier", tmp_path) in written
    assert not list(tmp_path.rglob("model.xml"))


def test_building_changes_no_tracked_file(built):
    """Every file the build writes is ignored by git: ``git status`` stays clean after the README's command."""
    outputs = [build.config_file(s) for s in build.SERVICES] + [build.model_file(s) for s in build.SERVICES]
    outputs += [build.tokenizer_dir(s) / name for s in build.SERVICES for name in build.TOKENIZER_FILES]
    assert all(path.is_file() for path in outputs)
    relative = [str(path.relative_to(ROOT)) for path in outputs]
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", *relative], cwd=ROOT, capture_output=True, text=True, check=False)
    assert sorted(ignored.stdout.split()) == sorted(relative)
    tracked = subprocess.run(["git", "ls-files", "--", *relative], cwd=ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout == ""


@pytest.mark.parametrize(
    ("backend", "precision", "field", "parameter"),
    [
        ("onnxruntime", "fp32", ("backend", "onnxruntime"), None),
        ("onnxruntime", "int8", ("backend", "onnxruntime"), None),
        ("openvino", "fp32", ("backend", "openvino"), ("INFERENCE_PRECISION_HINT", "f32")),
        ("openvino", "bf16", ("backend", "openvino"), ("HINT_BF16", "YES")),
        ("openvino", "int8", ("backend", "openvino"), None),
        ("pytorch", "fp32", ("platform", "pytorch_libtorch"), None),
    ],
)
def test_another_backends_config_is_the_tracked_one_swapped(backend, precision, field, parameter):
    for service in build.SERVICES:
        committed = build.source_config(service).read_text(encoding="utf-8")
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
        config.write_text(build.config_text(build.source_config(service).read_text(), "openvino", "int8"))
    assert build.built_backend("embedder", tmp_path) == "openvino"
    assert build.model_file("embedder", tmp_path).name == "model.xml"
    names = {p.name for p in build.missing(tmp_path) if p.parent.name == "1"}
    assert names == {"model.xml", "model.bin"}
