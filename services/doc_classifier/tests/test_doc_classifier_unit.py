"""doc_classifier in-process: its scoring functions, and the service on an embedded model service with the real
all-MiniLM-L6-v2 weights (what it answers, how it cuts long documents, what it refuses)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from litestar.testing import TestClient

from services.conftest import embedded_client

HERE = Path(__file__).resolve().parent
DOCUMENTS: dict[str, list[str]] = json.loads((HERE / "documents.json").read_text(encoding="utf-8"))
LABELS = ["sports", "business", "technology", "science", "health", "politics"]


def classifier_module():  # imported by load_service with the service folder on sys.path
    import classifier

    return classifier


@pytest.fixture(scope="module")
def client(built: None) -> Iterator[TestClient]:
    with embedded_client("doc_classifier") as c:
        yield c


def windows(tokens: int, max_tokens: int = 512, stride: int = 32, specials: int = 2) -> int:
    body = max_tokens - specials
    return 1 if tokens <= body else 1 + -(-(tokens - body) // (body - stride))


# --- the pure parts -----------------------------------------------------------------------------------


def test_score_is_cosine_and_softmax_over_the_temperature(client):
    c = classifier_module()
    docs = np.array([[1.0, 0.0], [0.6, 0.8]], np.float32)
    labels = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    similarity, probability = c.score(docs, labels, 0.1)
    np.testing.assert_allclose(similarity, [[1.0, 0.0], [0.6, 0.8]], atol=1e-6)
    np.testing.assert_allclose(probability.sum(axis=1), 1.0)
    assert probability[0, 0] == pytest.approx(1 / (1 + np.exp(-10)))
    _, sharper = c.score(docs, labels, 0.01)
    assert sharper[1, 1] > probability[1, 1] > 0.5  # a lower temperature sharpens the same preference


def test_rank_orders_best_first_and_keeps_label_order_on_ties(client):
    c = classifier_module()
    ranked = c.rank(["a", "b", "c"], np.array([0.1, 0.5, 0.5]), np.array([0.2, 0.4, 0.4]), 2)
    assert [s.label for s in ranked] == ["b", "c"]
    assert ranked[0].similarity == 0.5


# --- the service on the real weights --------------------------------------------------------------------


def test_labels_every_sample_document_right(client):
    texts = [t for label in LABELS for t in DOCUMENTS[label]]
    r = client.post("/v1/classify", json={"documents": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [res["label"] for res in body["results"]] == [label for label in LABELS for _ in DOCUMENTS[label]]
    for res in body["results"]:
        assert [s["label"] for s in res["scores"]] != []
        assert sorted(s["label"] for s in res["scores"]) == sorted(LABELS)
        assert sum(s["probability"] for s in res["scores"]) == pytest.approx(1.0, abs=1e-6)
        assert res["probability"] == res["scores"][0]["probability"]
        assert all(-1.0 <= s["similarity"] <= 1.0 for s in res["scores"])
        assert res["chunks"] == 1
    assert body["model"] == "all-MiniLM-L6-v2"
    assert set(body["timings_ms"]) == {"tokenize", "model", "aggregate"}
    assert all(v >= 0 for v in body["timings_ms"].values())


def test_one_document_as_a_string_is_the_same_as_a_list_of_one(client):
    text = DOCUMENTS["health"][0]
    one = client.post("/v1/classify", json={"documents": text}).json()
    listed = client.post("/v1/classify", json={"documents": [text]}).json()
    assert len(one["results"]) == 1
    assert one["results"] == listed["results"]


def test_a_long_document_is_cut_into_512_token_windows_and_still_labelled(client):
    tokenizer = tokenizers.Tokenizer.from_file(str(HERE.parent / "tokenizer" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    long_text = " ".join(DOCUMENTS["science"] * 40)
    short_text = DOCUMENTS["politics"][0]
    tokens = [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in (long_text, short_text)]
    assert tokens[0] > 2000
    r = client.post("/v1/classify", json={"documents": [long_text, short_text], "top_k": 2})
    assert r.status_code == 200, r.text
    long_result, short_result = r.json()["results"]
    assert long_result["tokens"] == tokens[0]
    assert long_result["chunks"] == windows(tokens[0]) > 4
    assert long_result["label"] == "science"
    assert len(long_result["scores"]) == 2
    assert (short_result["label"], short_result["chunks"], short_result["tokens"]) == ("politics", 1, tokens[1])


def test_a_repeated_document_scores_like_the_document(client):
    """Averaging windows of the same text gives about the text's own vector: pooling is by tokens, not by
    whatever a window's padding or length happens to be."""
    text = DOCUMENTS["business"][1]
    once, repeated = client.post("/v1/classify", json={"documents": [text, " ".join([text] * 60)]}).json()["results"]
    assert repeated["chunks"] > 1
    single = {s["label"]: s["similarity"] for s in once["scores"]}
    tiled = {s["label"]: s["similarity"] for s in repeated["scores"]}
    assert single == pytest.approx(tiled, abs=0.05)
    assert once["label"] == repeated["label"]


@pytest.mark.parametrize(
    ("body", "status", "where"),
    [
        ({"documents": []}, 422, "documents"),
        ({"documents": ["fine", "   "]}, 422, "documents[1]"),
        ({"documents": ""}, 422, "documents[0]"),
        ({"documents": ["x"] * 33}, 422, "documents"),
        ({"documents": "x", "top_k": 7}, 422, "top_k"),
        ({"documents": "x", "top_k": 0}, 400, "top_k"),
        ({"documents": 5}, 400, "documents"),
        ({"document": "typo in the field name"}, 400, "document"),
        ({}, 400, "documents"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(client, body, status, where):
    r = client.post("/v1/classify", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert where in r.text
    assert client.post("/v1/classify", json={"documents": "still serving"}).status_code == 200
