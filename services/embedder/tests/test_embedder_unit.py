"""embedder in-process on the real weights: vectors equal sentence-transformers' (reference.json, made by
make_reference.py beside this file) within 1e-4, OpenAI's request and answer shapes, and what it refuses."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient

from services.conftest import embedded_client

HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "reference.json").read_text(encoding="utf-8"))
SHORT = REFERENCE["short"]
LONG = REFERENCE["long"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def client(built: None) -> Iterator[TestClient]:
    with embedded_client("embedder") as c:
        yield c


def vectors(body: dict) -> np.ndarray:
    data = sorted(body["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float64)


def test_reference_covers_the_window_edge():
    assert max(item["tokens"] for item in SHORT) == 254  # 256 with [CLS] and [SEP]: sentence-transformers' limit
    assert all(item["tokens"] > 254 for item in LONG)


def test_vectors_equal_sentence_transformers_on_texts_up_to_256_tokens(client):
    r = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": [t["text"] for t in SHORT]})
    assert r.status_code == 200, r.text
    got = vectors(r.json())
    want = np.array([t["embedding"] for t in SHORT])
    assert got.shape == (len(SHORT), 384)
    diff = np.abs(got - want).max(axis=1)
    assert diff.max() < TOLERANCE, dict(zip([t["text"][:30] for t in SHORT], diff.round(6), strict=True))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_one_text_at_a_time_gives_the_same_vectors(client):
    """Batching pads texts to the longest one; the attention mask keeps the padding out of every vector."""
    for item in SHORT[:4] + SHORT[-3:]:
        r = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": item["text"]})
        got = vectors(r.json())[0]
        assert np.abs(got - np.array(item["embedding"])).max() < TOLERANCE, item["text"][:30]


def test_long_texts_are_windows_averaged_by_tokens(client):
    r = client.post("/v1/embeddings", json={"input": [t["text"] for t in LONG]})
    assert r.status_code == 200, r.text
    got = vectors(r.json())
    want = np.array([t["embedding"] for t in LONG])
    assert np.abs(got - want).max() < TOLERANCE
    assert r.json()["usage"]["prompt_tokens"] == sum(t["tokens"] for t in LONG)


def test_openai_shape_and_usage(client):
    texts = [SHORT[0]["text"], SHORT[1]["text"]]
    body = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": texts}).json()
    assert body["object"] == "list"
    assert body["model"] == "all-MiniLM-L6-v2"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    tokens = SHORT[0]["tokens"] + SHORT[1]["tokens"]
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # the model repository's own name is accepted too, and the model may be left out
    for model in ("minilm", None):
        request = {"input": texts} | ({"model": model} if model else {})
        assert client.post("/v1/embeddings", json=request).json()["data"] == body["data"]


def test_base64_is_little_endian_float32_of_the_same_vector(client):
    text = SHORT[3]["text"]
    floats = client.post("/v1/embeddings", json={"input": text}).json()["data"][0]["embedding"]
    encoded = client.post("/v1/embeddings", json={"input": text, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == np.asarray(floats, np.float32).tolist()


@pytest.mark.parametrize(
    ("body", "status", "where"),
    [
        ({"input": "x", "model": "text-embedding-3-small"}, 404, "model"),
        ({"input": "x", "dimensions": 256}, 422, "dimensions"),
        ({"input": [], "model": "all-MiniLM-L6-v2"}, 422, "input"),
        ({"input": ["a", " "]}, 422, "input[1]"),
        ({"input": [101, 2023]}, 400, "input"),  # token ids: not supported, and said so by the validator
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": "all-MiniLM-L6-v2"}, 400, "input"),
        ({"input": ["x"] * 257}, 422, "input"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(client, body, status, where):
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert where in r.text
    assert client.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200
