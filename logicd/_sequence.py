"""Per-document sequences: each document's windows sent in order as one sequence of a stateful model.

For a model under Triton's sequence batcher (``sequence_batching`` in its config.pbtxt) that keeps running
state across the windows of a document (a running aggregate, a recurrent summary) instead of logicd aggregating
each window's output afterwards. A document's first window carries ``sequence_start``, its last
``sequence_end``; the answer to the last window is the document's row. The documents of a request run
concurrently, each its own sequence (the server's sequence slots or candidates bound how many run at once; the
rest wait in its backlog). Over several model-service replicas a document's windows all go to one replica; if
that replica is lost mid-document, the document is sent again from its first window on another one
(``restarts`` times), since logicd still holds every window.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from modelsvc.client import AsyncClient, AsyncModel, SequenceLost

from ._infer import _gather_all, _window_inputs
from .text import Chunks

__all__ = ["infer_sequences"]

logger = logging.getLogger("logicd")


async def infer_sequences(
    client: AsyncClient, handle: AsyncModel, chunks: Chunks, output: str, *, restarts: int = 1
) -> NDArray[Any]:
    """One row of ``output`` per document: the model's answer to the document's last window, its windows sent
    in order as one sequence (see the module). A model with ``max_batch_size`` > 0 gets each window as one row
    (shape [1, tokens]) and its answer's first row is taken; otherwise the window and the answer as they are."""
    if chunks.num_docs == 0:
        return np.zeros((0,), np.float32)
    names = handle.inputs
    batched = bool(handle.metadata.max_batch_size)

    async def run(doc: int) -> NDArray[Any]:
        windows = chunks.spans[doc]
        async with client.sequence(handle.name, version=handle.version) as seq:
            answer: NDArray[Any] | None = None
            for k, i in enumerate(windows):
                ids = chunks.input_ids[i]
                row = ids.reshape(1, -1) if batched else ids
                inputs = _window_inputs(names, row, np.ones_like(row))
                result = await seq.infer(inputs, end=k == len(windows) - 1, outputs=[output])
                answer = np.asarray(result[output])
        assert answer is not None  # a document has at least one window
        return answer[0] if batched else answer

    def document(doc: int) -> Callable[[], Awaitable[NDArray[Any]]]:
        async def call() -> NDArray[Any]:
            for attempt in range(restarts + 1):
                try:
                    return await run(doc)
                except SequenceLost as exc:
                    if attempt == restarts:
                        raise
                    logger.warning("document %d: %s; sending its windows again from the first", doc, exc)
            raise AssertionError("unreachable")

        return call

    return np.stack(await _gather_all([document(d) for d in range(chunks.num_docs)]))
