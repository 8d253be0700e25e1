"""Zero-shot classification of documents of any length with all-MiniLM-L6-v2.

Each document is cut into windows of at most 512 tokens (special tokens included), every window goes through
the model (which mean-pools its tokens into one 384-d vector), the windows of a document are averaged weighted
by their token counts, and the document vector is compared by cosine similarity with the vector of each
label's description from service.yaml (embedded once at start-up). The answer per document: the best label,
a probability per label (softmax of the similarities over a temperature), the raw similarities, and how many
windows and tokens the document had; per request, the milliseconds spent in each stage.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from msgspec import Meta, Struct
from numpy.typing import NDArray

from logicd import Context, Service, ServiceError
from logicd.text import l2_normalize, mean_pool, softmax

MODEL = "minilm"
OUTPUT = "sentence_embedding"

service = Service()


class ClassifyRequest(Struct, forbid_unknown_fields=True):
    """One document, or a list of them."""

    documents: str | list[str]
    top_k: Annotated[int, Meta(ge=1)] | None = None
    """How many labels to list per document, best first (default: all)."""


class LabelScore(Struct):
    label: str
    probability: float
    """Softmax of the cosine similarities over the temperature: the labels of a document sum to 1."""
    similarity: float
    """Cosine similarity of the document with the label's description, in [-1, 1]."""


class DocumentResult(Struct):
    label: str
    """The best label."""
    probability: float
    scores: list[LabelScore]
    """Labels best first (``top_k`` of them when asked)."""
    chunks: int
    """Windows of at most 512 tokens the document was cut into."""
    tokens: int
    """Tokens of the document, special tokens excluded."""


class ClassifyResponse(Struct):
    results: list[DocumentResult]
    """One per document, in the order they were sent."""
    model: str
    timings_ms: dict[str, float]
    """Milliseconds spent in each stage of this request: tokenize, model, aggregate."""


async def embed_documents(ctx: Context, texts: list[str], field: str) -> tuple[NDArray[np.float32], Any]:
    """Unit vectors, one per text, and the chunks they were computed from (``field`` names the texts in errors)."""
    async with ctx.stage("tokenize"):
        chunks = await ctx.chunk(texts, field=field)
    async with ctx.stage("model"):
        vectors = await ctx.infer_chunks(MODEL, chunks, OUTPUT)
    async with ctx.stage("aggregate"):
        pooled = mean_pool(vectors, chunks.doc_index, chunks.token_counts, num_docs=chunks.num_docs)
        documents = l2_normalize(pooled).astype(np.float32)
    return documents, chunks


def score(
    documents: NDArray[np.float32], labels: NDArray[np.float32], temperature: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Cosine similarities (documents x labels) of unit vectors, and their softmax over ``temperature``."""
    similarity = documents.astype(np.float64) @ labels.astype(np.float64).T
    return similarity, softmax(similarity / temperature, axis=1)


def rank(
    names: list[str], similarity: NDArray[np.float64], probability: NDArray[np.float64], k: int
) -> list[LabelScore]:
    """The ``k`` best labels of one document, best first (ties keep the order of service.yaml)."""
    order = np.argsort(-probability, kind="stable")[:k]
    return [LabelScore(names[i], float(probability[i]), float(similarity[i])) for i in order]


@service.on_startup
async def embed_labels(ctx: Context) -> None:
    """Embed each label's description once; documents are compared with these vectors."""
    if not ctx.config.labels:
        raise ValueError("service.yaml: labels: at least one label with a description is needed")
    temperature = float(ctx.config.extra.get("temperature", 0.05))
    if not temperature > 0:
        raise ValueError(f"service.yaml: extra.temperature must be > 0, got {temperature}")
    vectors, _ = await embed_documents(ctx, list(ctx.config.labels.values()), "labels")
    ctx.state["labels"] = list(ctx.config.labels)
    ctx.state["label_vectors"] = vectors
    ctx.state["temperature"] = temperature


@service.post("/v1/classify")
async def classify(request: ClassifyRequest, ctx: Context) -> ClassifyResponse:
    """Classify documents of any length into the labels of service.yaml (zero-shot)."""
    texts = [request.documents] if isinstance(request.documents, str) else request.documents
    ctx.check_texts(texts, field="documents")
    names: list[str] = ctx.state["labels"]
    if request.top_k is not None and request.top_k > len(names):
        raise ServiceError(422, f"top_k is {request.top_k}, there are {len(names)} labels", field="top_k")
    documents, chunks = await embed_documents(ctx, texts, "documents")
    similarity, probability = score(documents, ctx.state["label_vectors"], ctx.state["temperature"])
    k = request.top_k or len(names)
    results = []
    for d in range(len(texts)):
        scores = rank(names, similarity[d], probability[d], k)
        results.append(
            DocumentResult(
                label=scores[0].label,
                probability=scores[0].probability,
                scores=scores,
                chunks=len(chunks.spans[d]),
                tokens=int(chunks.doc_token_counts[d]),
            )
        )
    timings = {stage: round(seconds * 1000.0, 3) for stage, seconds in ctx.timings.items()}
    return ClassifyResponse(results=results, model=str(ctx.config.extra.get("model_name", MODEL)), timings_ms=timings)
