"""Text toolkit of the logic server: load a tokenizer offline, chunk documents, batch chunks, aggregate outputs.

from logicd.text import Chunker, batches, load_tokenizer, mean_pool, tokenize_async
chunker = Chunker(load_tokenizer("model/tokenizer"), max_tokens=512, stride=64)
chunks = await tokenize_async(chunker, texts)            # off the event loop
for batch in batches(chunks, max_batch_size=8): ...      # int64 input_ids / attention_mask, padded
doc_vectors = mean_pool(chunk_vectors, chunks.doc_index, chunks.token_counts)
"""

from ._aggregate import LabelScore, l2_normalize, max_pool, mean_pool, softmax, top_k
from ._batching import Batch, batches, unbatch
from ._chunking import Chunker, Chunks
from ._pool import TokenizerPool, tokenize_async
from ._tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer

__all__ = [
    "Batch",
    "Chunker",
    "Chunks",
    "LabelScore",
    "Tokenizer",
    "TokenizerLoadError",
    "TokenizerPool",
    "batches",
    "l2_normalize",
    "load_tokenizer",
    "max_pool",
    "mean_pool",
    "softmax",
    "tokenize_async",
    "top_k",
    "unbatch",
]
