"""OpenAI-compatible text embeddings from all-MiniLM-L6-v2.

``POST /v1/embeddings`` takes OpenAI's request (``input``: a string or a list of strings, ``model``,
``encoding_format`` float or base64, ``dimensions``) and answers in OpenAI's shape, so the OpenAI SDKs work
against it by changing the base URL. (LangChain's OpenAIEmbeddings needs ``check_embedding_ctx_length=False``,
or it sends tiktoken ids instead of text, and ``chunk_size`` at most ``limits.max_documents``.)

Each text is cut into windows of at most 256 tokens (the model's max_seq_length in sentence-transformers), each
window is mean-pooled by the model, the windows of a text are averaged weighted by their token counts and the
result is L2-normalized. For a text of up to 256 tokens (one window) that is exactly sentence-transformers'
``encode(normalize_embeddings=True)``.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from msgspec import Struct

from logicd import Context, Service, ServiceError
from logicd.text import l2_normalize, mean_pool

MODEL = "minilm"
OUTPUT = "sentence_embedding"
DIMENSIONS = 384

service = Service()


class EmbeddingsRequest(Struct):
    """OpenAI's embeddings request. Token-id inputs are not supported: send text."""

    input: str | list[str]
    model: str | None = None
    """all-MiniLM-L6-v2 (or the model repository's name, minilm); any other name is 404."""
    encoding_format: Literal["float", "base64"] = "float"
    """base64: each vector as the base64 of its little-endian float32 bytes (what OpenAI's SDKs ask for)."""
    dimensions: int | None = None
    """Only 384, the model's own size, is accepted."""
    user: str | None = None
    """Accepted and ignored, as a self-hosted server has no use for it."""


class Embedding(Struct):
    embedding: list[float] | str
    index: int
    object: str = "embedding"


class Usage(Struct):
    prompt_tokens: int
    """Tokens of the inputs, special tokens excluded."""
    total_tokens: int


class EmbeddingsResponse(Struct):
    data: list[Embedding]
    model: str
    usage: Usage
    object: str = "list"


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector in the requested encoding: a list of floats, or base64 of little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    values: list[float] = np.asarray(vector, dtype=np.float32).tolist()
    return values


@service.post("/v1/embeddings")
async def embeddings(request: EmbeddingsRequest, ctx: Context) -> EmbeddingsResponse:
    """Embed one text or a list of texts (OpenAI's embeddings API)."""
    served = str(ctx.config.extra.get("model_name", MODEL))
    if request.model is not None and request.model not in (served, MODEL):
        raise ServiceError(404, f"model {request.model!r} is not served here; use {served!r}", field="model")
    if request.dimensions is not None and request.dimensions != DIMENSIONS:
        raise ServiceError(
            422,
            f"this model's vectors have {DIMENSIONS} dimensions, got dimensions={request.dimensions}",
            field="dimensions",
        )
    texts = [request.input] if isinstance(request.input, str) else request.input
    ctx.check_texts(texts, field="input")
    async with ctx.stage("tokenize"):
        chunks = await ctx.chunk(texts, field="input")
    async with ctx.stage("model"):
        vectors = await ctx.infer_chunks(MODEL, chunks, OUTPUT)
    pooled = mean_pool(vectors, chunks.doc_index, chunks.token_counts, num_docs=chunks.num_docs)
    unit = l2_normalize(pooled).astype(np.float32)
    tokens = int(chunks.doc_token_counts.sum())
    return EmbeddingsResponse(
        data=[Embedding(encode_vector(v, request.encoding_format), i) for i, v in enumerate(unit)],
        model=served,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )
