"""Running a request's chunks through a model: in padded batches, or one window per call when the model pads.

A model whose config.pbtxt has ``pad_inputs`` (modelsvc's padding-aware batcher) pads requests of different
lengths into one batch on the server, and cuts outputs that carry the padded axis (``pad_outputs``) back to
each request's own length. For such a model logicd sends every window as its own request (one row, at its own
length) and lets the server batch them; padding on the client would only make the server compute more. For
any other model (Triton's dynamic batcher batches equal shapes only) the windows are padded here to the
longest of a batch and sent in batches of the model's ``max_batch_size``, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from modelsvc.client import AsyncModel
from modelsvc.protocol import pad_entries

from .text import Batch, Chunks, batches, unbatch

__all__ = ["SEQUENCE_INPUTS", "Padding", "infer_chunks"]

logger = logging.getLogger("logicd")
T = TypeVar("T")

#: the inputs logicd builds from a window, each of one row per window and one position per token
SEQUENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Padding:
    """What a model's config says about padding: its ``pad_inputs`` as input name -> padded axis."""

    inputs: Mapping[str, int]

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any] | None) -> Padding | None:
        """From the model config's JSON (``/v2/models/<m>/config``): None where the model does not pad.

        ``pad_inputs`` is ``NAME:AXIS[=PAD]``, comma-separated, AXIS counted without the batch dimension. The
        server validates it when it loads the model; an entry logicd cannot read is logged and the model is
        treated as one that does not pad (the padded batches work on every server)."""
        parameters = (config or {}).get("parameters") or {}
        entry = parameters.get("pad_inputs")
        text = entry.get("string_value") if isinstance(entry, Mapping) else None
        if not isinstance(text, str) or not text.strip():
            return None
        try:
            entries = pad_entries(text, skip_empty=True)  # the server refuses an empty entry; logicd need not
        except ValueError as exc:
            logger.warning("model %r: %s; its windows go in padded batches", model, exc)
            return None
        for entry in entries:
            if not entry.axis.strip().lstrip("-").isdigit():
                logger.warning("model %r: pad_inputs: input %r has axis %r, not an integer; its windows go in "
                               "padded batches", model, entry.name, entry.axis)  # fmt: skip
                return None
        return cls({entry.name: int(entry.axis) for entry in entries})

    def pads(self, inputs: Mapping[str, str]) -> bool:
        """Whether every window input of ``inputs`` (the model's input names) is padded on its token axis (0)."""
        sent = [name for name in SEQUENCE_INPUTS if name in inputs]
        return bool(sent) and all(self.inputs.get(name) == 0 for name in sent)


def _window_inputs(
    names: Mapping[str, str], input_ids: NDArray[np.int64], attention_mask: NDArray[np.int64]
) -> dict[str, NDArray[Any]]:
    """The model's window inputs from ids and mask: int64 unless the model takes int32 (a TensorRT export)."""
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in names:
        inputs["token_type_ids"] = np.zeros_like(input_ids)
    return {k: v.astype(np.int32) if names[k] == "INT32" else v for k, v in inputs.items() if k in names}


async def _gather_all(calls: list[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``calls`` concurrently; the first failure cancels the others (no calls left running) and is raised."""
    tasks = [asyncio.ensure_future(call()) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _stack(rows: list[NDArray[Any]], output: str) -> NDArray[Any]:
    """One array from each window's answer (one row each). Rows of an output that carries the padded axis
    come back at their window's own length: they are stacked zero-filled to the longest, as one padded batch
    would give them (the positions past a window's length, ``chunks.lengths[i]``, are not the model's)."""
    for row in rows:
        if row.ndim == 0 or row.shape[0] != 1:
            raise ValueError(f"output {output!r} of shape {row.shape} for one window")
    shapes = {row.shape[1:] for row in rows}
    if len(shapes) == 1:
        return np.concatenate(rows)
    if len({len(shape) for shape in shapes}) != 1:
        raise ValueError(f"output {output!r} has rows of different ranks: {sorted(shapes)}")
    full = tuple(max(dims) for dims in zip(*shapes, strict=True))
    result = np.zeros((len(rows), *full), dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        result[(i, *(slice(0, n) for n in row.shape[1:]))] = row[0]
    return result


async def infer_chunks(
    handle: AsyncModel, chunks: Chunks, output: str, *, max_batch_size: int | None, padding: Padding | None
) -> NDArray[Any]:
    """One row of ``output`` per chunk, in chunk order; see the module's docstring for how the calls go out.

    ``max_batch_size`` (the model's when None) sizes the padded batches, or, when the model pads, bounds the
    windows in flight at once to twice that many (the server forms batches of up to that many)."""
    if len(chunks) == 0:
        return np.zeros((0,), np.float32)  # nothing to run: no call to the model
    limit = max_batch_size if max_batch_size is not None else (handle.metadata.max_batch_size or 0)
    names = handle.inputs
    if padding is not None and padding.pads(names):
        in_flight = asyncio.Semaphore(2 * max(limit, 1))

        def window(ids: NDArray[np.int64]) -> Callable[[], Awaitable[NDArray[Any]]]:
            async def call() -> NDArray[Any]:
                row = ids.reshape(1, -1)
                async with in_flight:
                    result = await handle.infer(_window_inputs(names, row, np.ones_like(row)), outputs=[output])
                return np.asarray(result[output])

            return call

        return _stack(await _gather_all([window(ids) for ids in chunks.input_ids]), output)

    groups = batches(chunks, limit)

    async def run(batch: Batch) -> NDArray[Any]:
        result = await handle.infer(_window_inputs(names, batch.input_ids, batch.attention_mask), outputs=[output])
        return np.asarray(result[output])

    outputs = await asyncio.gather(*(run(b) for b in groups))
    return unbatch(groups, list(outputs))
