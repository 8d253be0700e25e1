"""The naive baseline of doc_classifier: one process, tokenizer and ONNX Runtime in the request path.

What a team writes before it splits a service in two: a small HTTP app that, for each request, tokenizes the
documents, runs every 512-token window through the model on its own (batch 1, unpadded; nothing is batched
across requests or within one), then averages and scores the windows. It answers ``POST /v1/classify`` with the
JSON of services/doc_classifier, so the same load drives both, and ``GET /health/ready`` once the label
vectors are computed.

To make the comparison about serving, not about text handling, it uses the same tokenizer, window settings,
labels and temperature (read from the service's service.yaml), the same chunker and pooling (logicd.text),
and doc_classifier's own scoring functions and answer types. The model work runs in a worker thread
(``asyncio.to_thread``), the way a synchronous endpoint of a common Python web framework would, so concurrent
requests overlap on ONNX Runtime's own threads.

    python -m loadtests.naive_service --port 8090        # then POST /v1/classify as to doc_classifier
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import numpy as np
import yaml
from numpy.typing import NDArray

from logicd.text import Chunker, Chunks, l2_normalize, load_tokenizer, mean_pool

SERVICE_DIR = Path(__file__).resolve().parents[1] / "services" / "doc_classifier"
MODEL_NAME = "minilm"
OUTPUT = "sentence_embedding"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _classifier_module(service_dir: Path) -> ModuleType:
    """doc_classifier's logic module (``classifier.py``), loaded from its file: the service folder is no package."""
    spec = importlib.util.spec_from_file_location("_naive_doc_classifier", service_dir / "classifier.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the answer types' annotations through sys.modules
    spec.loader.exec_module(module)
    return module


class NaiveClassifier:
    """Tokenize, run each window alone through ONNX Runtime, pool and score: all in the caller's thread."""

    def __init__(self, service_dir: Path = SERVICE_DIR, model: Path | None = None) -> None:
        import onnxruntime as ort

        config = yaml.safe_load((service_dir / "service.yaml").read_text())
        chunking = config.get("chunking", {})
        tokenizer = load_tokenizer(service_dir / config["tokenizer"]["path"])
        self.chunker = Chunker(tokenizer, max_tokens=int(chunking["max_tokens"]), stride=int(chunking["stride"]))
        model_path = model or service_dir / "model_repository" / MODEL_NAME / "1" / "model.onnx"
        self.session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.logic = _classifier_module(service_dir)
        extra = config.get("extra", {})
        self.model_name = str(extra.get("model_name", MODEL_NAME))
        self.temperature = float(extra.get("temperature", 0.05))
        self.labels = list(config["labels"])
        self.label_vectors = self.embed(list(config["labels"].values()))

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        """Unit vectors, one per text."""
        return self.embed_chunks(self.chunker.chunk(texts))

    def embed_chunks(self, chunks: Chunks) -> NDArray[np.float32]:
        """Unit vectors, one per document: every window through the model alone, then a token-weighted mean."""
        rows = []
        for ids in chunks.input_ids:
            feed = {"input_ids": ids[None, :], "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
            if "token_type_ids" in self.input_names:
                feed["token_type_ids"] = np.zeros((1, len(ids)), dtype=np.int64)
            rows.append(self.session.run([OUTPUT], feed)[0][0])
        pooled = mean_pool(np.stack(rows), chunks.doc_index, chunks.token_counts, num_docs=chunks.num_docs)
        return l2_normalize(pooled).astype(np.float32)

    def classify(self, body: bytes) -> tuple[int, bytes]:
        """(status, JSON body) for one ``POST /v1/classify`` body, in doc_classifier's request and answer shapes."""
        logic = self.logic
        try:
            request = msgspec.json.decode(body, type=logic.ClassifyRequest)
        except msgspec.ValidationError as exc:
            return 400, json.dumps({"status": 400, "detail": str(exc)}).encode()
        texts = [request.documents] if isinstance(request.documents, str) else request.documents
        if not texts or any(not t.strip() for t in texts):
            return 422, json.dumps({"status": 422, "detail": "empty document"}).encode()
        k = request.top_k or len(self.labels)
        chunks = self.chunker.chunk(texts)
        vectors = self.embed_chunks(chunks)
        similarity, probability = logic.score(vectors, self.label_vectors, self.temperature)
        results = []
        for d in range(len(texts)):
            scores = logic.rank(self.labels, similarity[d], probability[d], k)
            results.append(
                logic.DocumentResult(
                    label=scores[0].label,
                    probability=scores[0].probability,
                    scores=scores,
                    chunks=len(chunks.spans[d]),
                    tokens=int(chunks.doc_token_counts[d]),
                )
            )
        answer = logic.ClassifyResponse(results=results, model=self.model_name, timings_ms={})
        return 200, msgspec.json.encode(answer)


class App:
    """A bare ASGI app: ``POST /v1/classify`` and ``GET /health/ready``; anything else is 404."""

    def __init__(self, classifier: NaiveClassifier) -> None:
        self.classifier = classifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/health/ready", "/health/live"):
            await _answer(send, 200, b'{"status":"ready"}')
        elif method == "POST" and path == "/v1/classify":
            body = bytearray()
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            status, payload = await asyncio.to_thread(self.classifier.classify, bytes(body))
            await _answer(send, status, payload)
        else:
            await _answer(send, 404, b'{"status":404,"detail":"not found"}')


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m loadtests.naive_service", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--service-dir", type=Path, default=SERVICE_DIR, help="doc_classifier's folder")
    parser.add_argument("--model", type=Path, help="the ONNX file (default: the service's model.onnx)")
    args = parser.parse_args(argv)
    app = App(NaiveClassifier(args.service_dir, args.model))
    uvicorn.run(app, host=args.host, port=args.port, lifespan="off", log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
