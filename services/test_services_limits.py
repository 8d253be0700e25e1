"""Regression tests from the review of the example services: bodies that do not decode, texts without tokens,
requests longer than the model can serve in time, callers that leave, int32 exports. Each failed before its fix."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from litestar.testing import TestClient

from logicd import create_app, load_config, load_service
from services import build
from services.conftest import HERE, Pair, embedded_client


@pytest.fixture(scope="module")
def embedder(built: None) -> Iterator[TestClient]:
    with embedded_client("embedder") as c:
        yield c


@pytest.fixture(scope="module")
def classifier(built: None) -> Iterator[TestClient]:
    with embedded_client("doc_classifier") as c:
        yield c


# --- a malformed body is a 400, never a 500 -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"input": "café au lait"}'.encode("latin-1"),  # a client that sends Latin-1, not UTF-8
        b'{"input": "ab\xff"}',  # a stray invalid byte inside a string
        b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nesting deeper than the decoder recurses
    ],
    ids=["latin-1", "invalid-byte", "deep-nesting"],
)
def test_a_body_that_does_not_decode_is_a_400_not_a_500(embedder: TestClient, body: bytes) -> None:
    """Litestar's decode_json raises UnicodeDecodeError / RecursionError (not a msgspec DecodeError) for these;
    logicd's _on_error (logicd/_app.py) maps every unknown exception to 500 "internal error" and logs a
    traceback, although the request is the client's mistake."""
    r = embedder.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert embedder.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


# --- doc_classifier: a document with no tokens is an empty document -----------------------------------


@pytest.mark.parametrize("text", ["\u200b", "\ufeff", "\x00", "\u0301"], ids=["zwsp", "bom", "nul", "combining"])
def test_a_document_without_any_token_is_refused_like_an_empty_one(classifier: TestClient, text: str) -> None:
    """check_texts (logicd/_app.py) refuses only what str.strip() empties; the tokenizer also drops format and
    control characters, so these documents have 0 tokens and are still given a label ("sports", from the
    [CLS] [SEP] vector alone) instead of the documented 422 for an empty document."""
    r = classifier.post("/v1/classify", json={"documents": ["The striker scored twice.", text]})
    if r.status_code == 200:
        result = r.json()["results"][1]
        pytest.fail(f"a document of {result['tokens']} tokens was labelled {result['label']!r}")
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "documents[1]"


# --- doc_classifier: long documents against the model service's time ------------------------------------

SERVICE = "doc_classifier"  # the `pair` fixture of services/conftest.py starts this service's two processes


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_document_of_max_text_chars_is_not_a_gateway_timeout(pair: Pair) -> None:
    """A document of limits.max_text_chars characters of CJK text is about one token a character: hundreds of
    windows, minutes of CPU. It used to end in a 504 after the model timeout; now limits.max_chunks refuses it
    up front with a 422 naming the document (an answer would do too; a 504 for a valid request would not)."""
    config = load_config(HERE / "doc_classifier" / "service.yaml")
    sentence = "東京は日本の首都です。"
    document = (sentence * (config.limits.max_text_chars // len(sentence) + 1))[: config.limits.max_text_chars]
    r = httpx.post(f"{pair.base}/v1/classify", json={"documents": document}, timeout=600)
    assert r.status_code != 504, r.text
    if r.status_code != 200:
        assert 400 <= r.status_code < 500, r.text
        assert r.json().get("field") == "documents[0]", r.text
    # and the pair is still there for the next caller
    assert httpx.post(f"{pair.base}/v1/classify", json={"documents": "hello"}, timeout=60).status_code == 200


@pytest.mark.integration
def test_a_request_its_caller_abandoned_stops_using_the_model(pair: Pair) -> None:
    """When the caller disconnects, the handler is cancelled and its model calls with it, so the windows of an
    abandoned long document stop running. Before the fix, a one-sentence request sent 1 s after abandoning a
    long document waited 22 s behind it on 2 cores."""
    # about 120 windows: within limits.max_chunks (128), several seconds of model time on 2 cores
    document = "The new smartphone chip doubles battery life and speeds up on-device AI. " * 3_700
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{pair.base}/v1/classify", json={"documents": document}, timeout=2)
    time.sleep(1)
    started = time.monotonic()
    r = httpx.post(f"{pair.base}/v1/classify", json={"documents": "The striker scored twice."}, timeout=120)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert took < 10, f"a one-sentence request waited {took:.1f} s behind a request nobody waits for"


# --- an int32 export (modelsvc export --int-dtype int32) cannot be used by a logicd service -------------


def _int32_copy(built_model: Path, target: Path) -> None:
    """The built model as ``modelsvc export --int-dtype int32`` writes it, without exporting MiniLM again (15 s):
    int32 id inputs, each cast to int64 inside the graph, and config.pbtxt saying TYPE_INT32. The export's own
    int32 path (tiny BERT) is tests/tools/test_export.py's test_classifier_with_int32_inputs_optimized."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(built_model / "1" / "model.onnx"))
    graph = model.graph
    casts = []
    for graph_input in graph.input:
        if graph_input.type.tensor_type.elem_type != TensorProto.INT64:
            continue
        name = graph_input.name
        graph_input.type.tensor_type.elem_type = TensorProto.INT32
        for node in graph.node:
            for k, used in enumerate(node.input):
                if used == name:
                    node.input[k] = f"{name}_int64"
        casts.append(helper.make_node("Cast", [name], [f"{name}_int64"], to=TensorProto.INT64))
    assert len(casts) == 3, [i.name for i in graph.input]
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    (target / "1").mkdir(parents=True)
    onnx.save(model, str(target / "1" / "model.onnx"))
    config = (built_model / "config.pbtxt").read_text(encoding="utf-8")
    assert config.count("TYPE_INT64") == 3, config
    (target / "config.pbtxt").write_text(config.replace("TYPE_INT64", "TYPE_INT32"), encoding="utf-8")


def test_the_embedder_runs_on_a_model_exported_with_int32_ids(built: None, tmp_path: Path) -> None:
    """`modelsvc export --int-dtype int32` is offered for engines that want int32 ids, but Context.infer_chunks
    (logicd/_app.py) always sends the int64 arrays that logicd.text.batches builds, whatever the model's
    metadata says: the client refuses them, and every request is a 422 "the model refused the input: input
    'input_ids' of model 'minilm' is INT32 (numpy int32), got a int64 array" (a 4xx blaming the caller for
    the server's own mismatch), while /health/ready says ready."""
    if build.built_backend("embedder") == "onnxruntime":
        _int32_copy(build.model_file("embedder").parents[1], tmp_path / "model_repository" / "minilm")
    else:  # built for OpenVINO (a CPU with bf16): no ONNX file to start from
        pytest.importorskip("torch", reason="export needs modelsvc[export]")
        from modelsvc.tools.export import ExportOptions, export_model

        export_model(
            ExportOptions(
                model=str(build._source()),
                model_repository=tmp_path / "model_repository",
                model_name="minilm",
                pooling="mean",
                int_dtype="int32",
                max_batch_size=16,
                log=lambda line: None,
            )
        )
    source = HERE / "embedder"
    shutil.copy(source / "embeddings.py", tmp_path)
    shutil.copy(source / "service.yaml", tmp_path)
    shutil.copytree(source / "tokenizer", tmp_path / "tokenizer")
    reference = json.loads((source / "tests" / "reference.json").read_text(encoding="utf-8"))["short"][:3]
    env = {"LOGICD_MODEL_SERVICE__URL": "embedded", "LOGICD_MODEL_SERVICE__MODEL_REPOSITORY": "./model_repository"}
    config = load_config(tmp_path / "service.yaml", env)
    with TestClient(create_app(load_service(config, tmp_path), config), timeout=60) as client:
        r = client.post("/v1/embeddings", json={"input": [item["text"] for item in reference]})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        assert np.abs(got - np.array([item["embedding"] for item in reference])).max() < 1e-4
