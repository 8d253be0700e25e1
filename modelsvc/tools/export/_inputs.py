"""The random inputs the export traces with and the check runs: token ids within the vocabulary, and
attention masks that pad some rows on the right and some on the left, so the check sees both kinds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ._wrapper import Plan

__all__ = ["SEED", "TRACE_SHAPE", "Feeds", "longest", "random_inputs"]

# (batch, sequence) of the inputs the export traces with
TRACE_SHAPE = (2, 16)
SEED = 20240605

Feeds = dict[str, npt.NDArray[np.integer[Any]]]


def random_inputs(rng: np.random.Generator, config: Any, plan: Plan, batch: int, length: int, pad: bool) -> Feeds:
    """Random token ids within the vocabulary; with ``pad``, row 1 is right-padded and row 2 left-padded
    (not for cls pooling, which reads the first position whether or not it is padding)."""
    dtype = np.int32 if plan.int_dtype == "int32" else np.int64
    vocab = int(getattr(config, "vocab_size", 0) or 100)
    ids = rng.integers(0, vocab, size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), np.int64)
    if pad and batch > 1:
        mask[1, max(1, length * 2 // 3) :] = 0
    if pad and batch > 2 and plan.pooling != "cls":
        mask[2, : length // 3] = 0
    feeds: Feeds = {"input_ids": ids.astype(dtype), "attention_mask": mask.astype(dtype)}
    if "token_type_ids" in plan.input_names:
        types = int(getattr(config, "type_vocab_size", 1) or 1)
        feeds["token_type_ids"] = rng.integers(0, types, size=(batch, length), dtype=np.int64).astype(dtype)
    return feeds


def longest(config: Any) -> int:
    """A sequence length every model of this config takes (RoBERTa-style ones lose 2 positions to padding)."""
    return int(getattr(config, "max_position_embeddings", 0) or 512) - 2
