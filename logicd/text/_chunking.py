"""Cutting documents into windows of at most ``max_tokens`` tokens, special tokens on every window.

Approach: one ``encode_batch`` call without special tokens and without truncation for all texts of a request,
then windows cut over the ids in Python, each framed with the post-processor's prefix and suffix ids. This
never reconfigures the shared Rust tokenizer (a truncating call with overflow would leave truncation set on it,
and reconfiguring it while another thread encodes fails), so one `Chunker` serves all threads at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._tokenizer import Tokenizer

__all__ = ["Chunker", "Chunks"]

IntArray = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Chunks:
    """The chunks of a request's documents, in document order, each a window of one document.

    Chunk ``i`` belongs to document ``doc_index[i]``; document ``d`` owns chunks ``spans[d]`` (never empty).
    """

    input_ids: list[IntArray]
    """Token ids of each chunk, special tokens included (1-D int64 arrays of varying length)."""
    doc_index: IntArray
    """The document each chunk comes from (chunk → document map)."""
    starts: IntArray
    """Position of each chunk's first document token among its document's tokens."""
    token_counts: IntArray
    """Document tokens in each chunk, special tokens excluded: the weight of a chunk when pooling."""
    spans: list[range]
    """The chunks of each document (document → chunks map)."""
    doc_token_counts: IntArray
    """Tokens of each whole document, special tokens excluded."""
    pad_id: int
    """The tokenizer's pad id, for batching."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_docs(self) -> int:
        """Number of documents."""
        return len(self.spans)

    @property
    def lengths(self) -> IntArray:
        """Length of each chunk, special tokens included."""
        return np.fromiter((len(ids) for ids in self.input_ids), dtype=np.int64, count=len(self.input_ids))

    @property
    def attention_mask(self) -> list[IntArray]:
        """Attention mask of each chunk (all ones: a chunk holds no padding until it is batched)."""
        return [np.ones(len(ids), dtype=np.int64) for ids in self.input_ids]


class Chunker:
    """Cuts texts into windows of at most ``max_tokens`` tokens, special tokens included.

    ``stride`` is the number of tokens consecutive windows of one document share (0: no overlap). A document
    of ``n`` tokens fits in one window when ``n <= max_tokens - specials``; otherwise windows start every
    ``max_tokens - specials - stride`` tokens and the last one ends with the document (it may be shorter).
    An empty or whitespace-only text gives one chunk of special tokens only (``token_counts`` 0), as the
    tokenizer itself would encode it; services refuse empty text before it gets here.

    Thread-safe: `chunk` reads the tokenizer and its own settings only.
    """

    def __init__(self, tokenizer: Tokenizer, max_tokens: int = 512, stride: int = 0) -> None:
        specials = tokenizer.num_special_tokens
        if max_tokens <= specials:
            raise ValueError(f"max_tokens={max_tokens} leaves no room next to {specials} special tokens")
        limit = tokenizer.model_max_length
        if limit is not None and max_tokens > limit:
            raise ValueError(f"max_tokens={max_tokens} exceeds the model's maximum length {limit}")
        window = max_tokens - specials
        if not 0 <= stride < window:
            raise ValueError(f"stride must satisfy 0 <= stride < {window} (max_tokens - special tokens), got {stride}")
        self._tokenizer = tokenizer
        self._max_tokens = max_tokens
        self._stride = stride
        self._window = window
        self._prefix = np.asarray(tokenizer.prefix_ids, dtype=np.int64)
        self._suffix = np.asarray(tokenizer.suffix_ids, dtype=np.int64)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer this chunker uses."""
        return self._tokenizer

    @property
    def max_tokens(self) -> int:
        """Maximum tokens per chunk, special tokens included."""
        return self._max_tokens

    @property
    def stride(self) -> int:
        """Tokens shared by consecutive windows of a document."""
        return self._stride

    def chunk(self, texts: Sequence[str]) -> Chunks:
        """Tokenize ``texts`` in one batch call and cut each into windows; see the class docstring."""
        if isinstance(texts, str):
            raise TypeError("chunk() takes a sequence of texts, not one string")
        all_ids = self._tokenizer.encode_ids(texts)
        step = self._window - self._stride
        input_ids: list[IntArray] = []
        doc_index: list[int] = []
        starts: list[int] = []
        counts: list[int] = []
        spans: list[range] = []
        doc_counts: list[int] = []
        for doc, ids in enumerate(all_ids):
            tokens = np.asarray(ids, dtype=np.int64)
            n = len(tokens)
            windows = 1 if n <= self._window else 1 + -(-(n - self._window) // step)
            first = len(input_ids)
            for start in range(0, windows * step, step):
                body = tokens[start : start + self._window]
                input_ids.append(np.concatenate((self._prefix, body, self._suffix)))
                starts.append(start)
                counts.append(len(body))
            doc_index.extend([doc] * windows)
            spans.append(range(first, first + windows))
            doc_counts.append(n)
        return Chunks(
            input_ids=input_ids,
            doc_index=np.asarray(doc_index, dtype=np.int64),
            starts=np.asarray(starts, dtype=np.int64),
            token_counts=np.asarray(counts, dtype=np.int64),
            spans=spans,
            doc_token_counts=np.asarray(doc_counts, dtype=np.int64),
            pad_id=self._tokenizer.pad_id,
        )

    def __repr__(self) -> str:
        return f"Chunker(max_tokens={self._max_tokens}, stride={self._stride}, tokenizer={self._tokenizer!r})"
