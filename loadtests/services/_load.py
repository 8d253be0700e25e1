"""The loads of bench_services and its correctness guard.

doc_classifier: POST /v1/classify with one long document per request (loadtests/harness/_documents.py), documents/s.
embedder: POST /v1/embeddings (OpenAI's shape) with 8 short texts per request, requests/s.
The guard sends the same requests, one at a time, to both checkouts' pairs and wants the same labels (and window
counts) for the documents and embeddings within 1e-5 of each other; a difference stops the run before it measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from loadtests.harness._documents import all_short_documents, long_documents
from loadtests.suite._rows import Stats, json_load

DOC_PATH = "/v1/classify"
EMB_PATH = "/v1/embeddings"
EMB_MODEL = "all-MiniLM-L6-v2"
EMB_TEXTS_PER_REQUEST = 8
EMB_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Load:
    """One service's load: what to POST, at which concurrency, and what one answer counts as."""

    service: str
    path: str
    bodies: tuple[bytes, ...]
    concurrency: int
    unit: str

    def measure(self, base_url: str, seconds: float) -> Stats:
        # every answer counts, over the time to the last one: a window that counted only the answers inside it gave
        # 0/s (no ratio) where one long document outlasted a short window on a busy machine; the guard warmed up
        stats = json_load(f"{base_url}{self.path}", self.bodies, self.concurrency, seconds, until_last=True)
        if stats.errors:
            raise RuntimeError(f"{stats.errors} failed requests to {self.service} at {base_url}")
        return stats


def doc_load(tokens: tuple[int, int], concurrency: int = 4, count: int = 24) -> Load:
    """The doc_classifier load: ``count`` long documents of ``tokens`` (min, max) tokens, one per request."""
    docs = long_documents(count, *tokens, seed=16)
    bodies = tuple(json.dumps({"documents": [text]}).encode() for _, text in docs)
    return Load("doc_classifier", DOC_PATH, bodies, concurrency, "docs/s")


def emb_load(concurrency: int = 8, count: int = 18) -> Load:
    """The embedder load: ``count`` requests of 8 short texts each, the texts taken in turn."""
    texts = all_short_documents()
    bodies = []
    for i in range(count):
        group = [texts[(i * EMB_TEXTS_PER_REQUEST + k) % len(texts)] for k in range(EMB_TEXTS_PER_REQUEST)]
        bodies.append(json.dumps({"model": EMB_MODEL, "input": group}).encode())
    return Load("embedder", EMB_PATH, tuple(bodies), concurrency, "requests/s")


def _post(base_url: str, path: str, body: bytes) -> Any:
    response = httpx.post(f"{base_url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=300)
    response.raise_for_status()
    return response.json()


def guard_documents(base: str, current: str, load: Load, checks: int) -> str:
    """Both sides give each of the first ``checks`` documents the same label and window count."""
    same, worst, chunks = 0, 0.0, []
    for body in load.bodies[:checks]:
        a, b = _post(base, load.path, body)["results"][0], _post(current, load.path, body)["results"][0]
        pa = {s["label"]: s["probability"] for s in a["scores"]}
        pb = {s["label"]: s["probability"] for s in b["scores"]}
        worst = max(worst, max(abs(pa[k] - pb.get(k, np.inf)) for k in pa))
        same += a["label"] == b["label"] and a["chunks"] == b["chunks"]
        chunks.append(a["chunks"])
    note = (f"doc_classifier: labels agree {same}/{checks} (windows/doc {min(chunks)}-{max(chunks)}, "
            f"max probability difference {worst:.1e})")  # fmt: skip
    if same != checks:
        raise RuntimeError(f"correctness guard failed: {note}")
    return note


def guard_embeddings(base: str, current: str, load: Load, checks: int) -> str:
    """Both sides give the first ``checks`` requests' texts embeddings within EMB_TOLERANCE of each other."""
    worst, vectors = 0.0, 0
    for body in load.bodies[:checks]:
        a = np.asarray([d["embedding"] for d in _post(base, load.path, body)["data"]], dtype=np.float64)
        b = np.asarray([d["embedding"] for d in _post(current, load.path, body)["data"]], dtype=np.float64)
        if a.shape != b.shape:
            raise RuntimeError(f"correctness guard failed: embedder answered shapes {a.shape} and {b.shape}")
        worst = max(worst, float(np.max(np.abs(a - b))))
        vectors += len(a)
    note = f"embedder: {vectors} embeddings, max difference {worst:.1e} (tolerance {EMB_TOLERANCE:.0e})"
    if not worst <= EMB_TOLERANCE:
        raise RuntimeError(f"correctness guard failed: {note}")
    return note
