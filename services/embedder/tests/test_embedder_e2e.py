"""embedder as it runs in production (modelsvc and logicd in two processes), driven by the official OpenAI
Python SDK, which asks for base64 vectors by default and decodes them itself."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from logicd.text import Chunker, load_tokenizer

pytestmark = pytest.mark.integration

SERVICE = "embedder"  # the `pair` fixture in services/conftest.py starts this service
HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "reference.json").read_text(encoding="utf-8"))


def sdk(pair) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pair.base}/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_openai_sdk_gets_sentence_transformers_vectors(pair):
    texts = [t["text"] for t in REFERENCE["short"]]
    with sdk(pair) as client:
        result = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    got = np.array([d.embedding for d in sorted(result.data, key=lambda d: d.index)])
    want = np.array([t["embedding"] for t in REFERENCE["short"]])
    assert np.abs(got - want).max() < 1e-4
    assert result.usage.prompt_tokens == sum(t["tokens"] for t in REFERENCE["short"])
    assert result.model == "all-MiniLM-L6-v2"


def test_the_openai_sdk_sees_an_unknown_model_as_not_found(pair):
    with sdk(pair) as client, pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-large", input="hello")


def test_concurrent_callers_each_get_their_own_vectors(pair):
    items = REFERENCE["short"] + REFERENCE["long"]

    def one(item: dict) -> float:
        r = httpx.post(f"{pair.base}/v1/embeddings", json={"input": item["text"]}, timeout=60)
        assert r.status_code == 200, r.text
        return float(np.abs(np.array(r.json()["data"][0]["embedding"]) - np.array(item["embedding"])).max())

    with ThreadPoolExecutor(8) as pool:
        diffs = list(pool.map(one, items * 3))
    assert max(diffs) < 1e-4


def test_a_long_texts_windows_go_to_the_padding_model_one_request_each(pair):
    """The model's config has pad_inputs: logicd sends each 256-token window as its own request, at its own
    length, and modelsvc batches them; the vector is the same."""
    item = REFERENCE["long"][-1]
    windows = len(Chunker(load_tokenizer(HERE.parent / "tokenizer"), max_tokens=256).chunk([item["text"]]))
    assert windows > 1
    before = pair.model.model_stats("minilm")["inference_stats"]["success"]["count"]
    r = httpx.post(f"{pair.base}/v1/embeddings", json={"input": item["text"]}, timeout=60)
    assert r.status_code == 200, r.text
    assert np.abs(np.array(r.json()["data"][0]["embedding"]) - np.array(item["embedding"])).max() < 1e-4
    assert pair.model.model_stats("minilm")["inference_stats"]["success"]["count"] - before == windows
