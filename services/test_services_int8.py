"""Calibrated int8 for the services, on the real model: ``python -m services.build --backend openvino --precision
int8`` exports all-MiniLM-L6-v2 once for both services, calibrated on the text they ship, and writes it only after
the parity check passes: the classifier's labels unchanged on its test documents and its pooled vectors within a
cosine of 0.99 of PyTorch fp32's (512-token windows among them), the embedder's vectors within 0.99 of
sentence-transformers'. The checks are re-run here on what was written, so a build that skipped them would fail."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services import build
from services._build_parity import calibration_texts, classifier_cosines, classifier_labels, embedder_parity

pytest.importorskip("openvino", reason="int8 is built for OpenVINO: pip install -e '.[openvino]'")
pytest.importorskip("nncf", reason="int8 is built for OpenVINO: pip install -e '.[openvino]'")


def _tree(root: Path) -> None:
    """A copy of what the services need besides the model: configs, tests' documents, examples, tokenizers."""
    for service in build.SERVICES:
        source = build.HERE / service
        target = root / service
        (target / "tests").mkdir(parents=True)
        for name in ("service.yaml", "example.json", f"{build.MODEL_NAME}.config.pbtxt"):
            shutil.copy(source / name, target / name)
        for name in ("documents.json", "reference.json"):
            if (source / "tests" / name).is_file():
                shutil.copy(source / "tests" / name, target / "tests" / name)
        for name in ("classifier.py", "embeddings.py"):
            if (source / name).is_file():
                shutil.copy(source / name, target / name)


#: where the services' default build is calibrated int8 already (a CPU with VNNI or AMX), that build checked the
#: classifier's parity at int8 and the services' tests run on it; a second int8 export of both would cost the suite
#: a minute and a half more of its 15
DEFAULT_IS_INT8 = bool(build.INT8_DOT & build.cpu_flags())


@pytest.mark.skipif(
    DEFAULT_IS_INT8,
    reason="this CPU's default build is calibrated int8 already: its parity is checked at build and the services' "
    "tests run on it; the both-services int8 build runs where the default is not int8",
)
@pytest.mark.timeout(1200)
def test_int8_for_both_services_keeps_their_parity(tmp_path):
    _tree(tmp_path)
    said: list[str] = []
    written = build.build(say=said.append, root=tmp_path, backend="openvino", precision="int8")
    assert sum("exporting" in line for line in said) == 1, said  # one export for both
    assert build.model_file("doc_classifier", tmp_path) in written
    for service in build.SERVICES:
        assert build.built_backend(service, tmp_path) == "openvino"
        config = build.config_file(service, tmp_path).read_text()
        assert "--precision int8" in config
        assert "HINT" not in config  # OpenVINO's own choice for what stays float, as the export checked it
        xml = build.model_file(service, tmp_path).read_text()
        assert xml.count('type="FakeQuantize"') >= 24  # activations quantized: 4 MatMul inputs a layer at least
    calibrated = next(line for line in said if "calibrated on 300 windows of the services' own text" in line)
    assert "feed-forward blocks' second MatMul" in calibrated

    repository = tmp_path / "doc_classifier" / "model_repository"
    assert classifier_labels(repository, tmp_path) == []
    cosines = classifier_cosines(repository, tmp_path)
    assert len(cosines) >= 18 + 2  # every test document, and 512-token windows of them joined
    assert min(cosines) >= build.MIN_COSINE["int8"]
    assert max(cosines) < 0.99999  # int8 really moved them
    embedder, _ = embedder_parity(tmp_path / "embedder" / "model_repository", tmp_path)
    assert min(embedder) >= build.MIN_COSINE["int8"]
    stated = next(line for line in said if "doc_classifier's pooled vectors vs PyTorch fp32" in line)
    assert f"min cosine {min(cosines):.6f}" in stated


def test_the_calibration_text_is_what_the_services_ship():
    texts = calibration_texts(["doc_classifier"], build.HERE)
    assert "The coach was sacked on Monday after the club lost six league games in a row." in texts
    assert any(text.startswith("Sports news about athletes") for text in texts)  # a label's description
    assert len(texts) == 18 + 6 + 1
    both = calibration_texts(list(build.SERVICES), build.HERE)
    assert "東京は日本の首都です。" in both  # the embedder's reference texts
    assert set(texts) < set(both)
