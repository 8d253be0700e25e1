"""Pure numpy helpers that turn chunk outputs into document outputs: pooling, softmax, top-k, normalization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["LabelScore", "l2_normalize", "max_pool", "mean_pool", "softmax", "top_k"]


class LabelScore(NamedTuple):
    """A label with its score, as `top_k` returns them."""

    label: str
    score: float


def _grouped(
    values: ArrayLike, doc_index: ArrayLike, num_docs: int | None
) -> tuple[NDArray[Any], NDArray[np.intp], NDArray[np.intp]]:
    """Values sorted by document (stable) and the offset of each document's first row."""
    array = np.asarray(values)
    docs = np.asarray(doc_index, dtype=np.intp)
    if array.ndim == 0 or docs.shape != array.shape[:1]:
        raise ValueError(f"values of shape {array.shape} do not match doc_index of shape {docs.shape}")
    if docs.size and docs.min() < 0:
        raise ValueError("doc_index holds a negative document")
    count = int(docs.max()) + 1 if docs.size else 0
    if num_docs is not None:
        if count > num_docs:
            raise ValueError(f"doc_index names document {count - 1} of {num_docs}")
        count = num_docs
    per_doc = np.bincount(docs, minlength=count)
    if count == 0 or not per_doc.all():
        missing = np.flatnonzero(per_doc == 0)
        raise ValueError(f"documents without chunks: {missing.tolist() or 'no documents at all'}")
    order = np.argsort(docs, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(per_doc)[:-1])).astype(np.intp)
    return array[order], order, offsets


def mean_pool(
    values: ArrayLike, doc_index: ArrayLike, weights: ArrayLike | None = None, *, num_docs: int | None = None
) -> NDArray[np.floating[Any]]:
    """Mean of each document's chunk rows, weighted by ``weights`` (e.g. `Chunks.token_counts`) when given.

    A document whose weights sum to 0 (an empty text: a chunk of specials only) gets the plain mean.
    Returns shape (documents, *values.shape[1:]); float32 input stays float32, anything else gives float64.
    """
    ordered, order, offsets = _grouped(values, doc_index, num_docs)
    dtype = ordered.dtype if ordered.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    data = ordered.astype(np.float64)
    if weights is None:
        w = np.ones(len(data))
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != data.shape[:1]:
            raise ValueError(f"weights of shape {w.shape} for {len(data)} chunks")
        if (w < 0).any() or not np.isfinite(w).all():
            raise ValueError("weights must be finite and >= 0")
        w = w[order]
    total = np.add.reduceat(w, offsets)
    unweighted = total == 0
    if unweighted.any():
        docs = np.repeat(np.arange(len(offsets)), np.diff(np.append(offsets, len(data))))
        w = np.where(unweighted[docs], 1.0, w)
        total = np.add.reduceat(w, offsets)
    shaped = w.reshape(-1, *([1] * (data.ndim - 1)))
    sums = np.add.reduceat(data * shaped, offsets, axis=0)
    result: NDArray[np.floating[Any]] = (sums / total.reshape(-1, *([1] * (data.ndim - 1)))).astype(dtype)
    return result


def max_pool(values: ArrayLike, doc_index: ArrayLike, *, num_docs: int | None = None) -> NDArray[Any]:
    """Element-wise maximum of each document's chunk rows; shape (documents, *values.shape[1:]), dtype kept."""
    ordered, _, offsets = _grouped(values, doc_index, num_docs)
    result: NDArray[Any] = np.maximum.reduceat(ordered, offsets, axis=0)
    return result


def softmax(logits: ArrayLike, axis: int = -1) -> NDArray[np.floating[Any]]:
    """Numerically stable softmax along ``axis`` (the maximum is subtracted first, so large logits are fine)."""
    array = np.asarray(logits)
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float64)
    shifted = array - np.max(array, axis=axis, keepdims=True)
    exp = np.exp(shifted)
    result: NDArray[np.floating[Any]] = exp / np.sum(exp, axis=axis, keepdims=True)
    return result


def top_k(scores: ArrayLike, labels: Sequence[str], k: int) -> list[LabelScore]:
    """The ``k`` best (label, score) pairs of a 1-D score vector, highest first; ties keep label order."""
    array = np.asarray(scores)
    if array.ndim != 1 or len(array) != len(labels):
        raise ValueError(f"scores of shape {array.shape} for {len(labels)} labels")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    best = np.argsort(-array, kind="stable")[:k]
    return [LabelScore(labels[i], float(array[i])) for i in best]


def l2_normalize(values: ArrayLike, axis: int = -1, eps: float = 1e-12) -> NDArray[np.floating[Any]]:
    """``values`` scaled to unit L2 norm along ``axis`` (vectors shorter than ``eps`` are divided by ``eps``)."""
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float64)
    norm = np.linalg.norm(array, axis=axis, keepdims=True)
    result: NDArray[np.floating[Any]] = array / np.maximum(norm, eps)
    return result
