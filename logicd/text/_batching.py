"""Grouping a request's chunks into model calls, and putting the outputs back in chunk order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._chunking import Chunks

__all__ = ["Batch", "batches", "unbatch"]


@dataclass(frozen=True, eq=False)
class Batch:
    """One model call: chunks padded to the longest of them, with the indices of the chunks it holds."""

    input_ids: NDArray[np.int64]
    """Token ids, shape (batch, longest chunk), padded with the tokenizer's pad id."""
    attention_mask: NDArray[np.int64]
    """1 for a token, 0 for padding; same shape as ``input_ids``."""
    indices: NDArray[np.int64]
    """The chunk (index into `Chunks`) in each row."""

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def token_type_ids(self) -> NDArray[np.int64]:
        """Zeros shaped like ``input_ids``: the segment ids of single-sequence BERT inputs."""
        return np.zeros_like(self.input_ids)


def batches(chunks: Chunks, max_batch_size: int, *, sort_by_length: bool = True) -> list[Batch]:
    """Split ``chunks`` into as few model calls as ``max_batch_size`` allows.

    ``max_batch_size`` is the model's (``config.pbtxt``): 0 means the model does not batch, so each chunk is
    its own call (arrays still have a leading dimension of 1). With ``sort_by_length`` chunks of similar
    length share a batch (less padding; the call count is the same); `unbatch` restores chunk order.
    """
    if max_batch_size < 0:
        raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
    size = max_batch_size or 1
    lengths = chunks.lengths
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(len(chunks), dtype=np.int64)
    result = []
    for begin in range(0, len(order), size):
        rows = order[begin : begin + size].astype(np.int64)
        width = int(lengths[rows].max())
        input_ids = np.full((len(rows), width), chunks.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for row, chunk in enumerate(rows):
            ids = chunks.input_ids[chunk]
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        result.append(Batch(input_ids=input_ids, attention_mask=mask, indices=rows))
    return result


def unbatch(batches: Sequence[Batch], outputs: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """One output row per chunk, in chunk order, from each batch's output (first dimension = batch rows)."""
    if len(batches) != len(outputs):
        raise ValueError(f"{len(outputs)} outputs for {len(batches)} batches")
    if not batches:
        raise ValueError("no batches")
    total = sum(len(batch) for batch in batches)
    first = np.asarray(outputs[0])
    result = np.empty((total, *first.shape[1:]), dtype=first.dtype)
    for batch, output in zip(batches, outputs, strict=True):
        array = np.asarray(output)
        if array.shape[0] != len(batch) or array.shape[1:] != first.shape[1:]:
            raise ValueError(f"output of shape {array.shape} for a batch of {len(batch)} chunks")
        result[batch.indices] = array
    return result
