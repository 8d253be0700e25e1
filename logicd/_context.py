"""What a handler works with: ``Context`` (models, tokenizer, chunks, sequences, streams, timed stages)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from litestar.response import ServerSentEvent
from opentelemetry.trace import Tracer

from modelsvc.client import AsyncClient, AsyncModel, InferResult, ServerUnavailable, StreamingUnsupported

from ._config import ServiceConfig
from ._infer import Padding, infer_chunks
from ._metrics import Metrics
from ._problems import ServiceError
from ._sequence import infer_sequences
from ._stream import stream_events
from .text import Chunker, Chunks, TokenizerPool


class Runtime(Protocol):
    """What a Context reads of the app's runtime (``_app._Runtime``)."""

    config: ServiceConfig
    state: dict[str, Any]
    models: dict[str, AsyncModel]
    padding: dict[str, Padding | None]
    chunker: Chunker | None
    pool: TokenizerPool | None
    metrics: Metrics
    tracer: Tracer
    client: AsyncClient | None


class Context:
    """What a handler works with: the config, the models, the tokenizer, timed stages, shared state."""

    def __init__(self, runtime: Runtime, route: str, models: dict[str, AsyncModel] | None = None) -> None:
        self._runtime = runtime
        self.route = route
        self._models = models if models is not None else runtime.models
        self.timings: dict[str, float] = {}
        """Seconds spent in each `stage` of this request so far (a stage entered twice adds up)."""
        self.rows = 0
        self.tokens = 0
        """Windows and tokens this request sent through `infer_chunks` (what admission learns a request costs)."""

    @property
    def config(self) -> ServiceConfig:
        return self._runtime.config

    @property
    def state(self) -> dict[str, Any]:
        """Shared by every request (fill it in an on_startup hook)."""
        return self._runtime.state

    def model(self, name: str) -> AsyncModel:
        """The checked handle of a model listed in service.yaml."""
        handle = self._models.get(name)
        if handle is None:
            if name not in {m.name for m in self.config.models}:
                raise KeyError(f"model {name!r} is not listed under models in service.yaml")
            raise ServerUnavailable(f"model {name!r} is not reachable yet")
        return handle

    @property
    def chunker(self) -> Chunker:
        if self._runtime.chunker is None:
            raise RuntimeError("no tokenizer: set tokenizer.path in service.yaml")
        return self._runtime.chunker

    async def chunk(self, texts: Sequence[str], field: str = "texts") -> Chunks:
        """Tokenize and cut into windows off the event loop (a long document never stalls other requests).

        Refuses with 422 naming ``field[i]`` a text with no token the model reads (only whitespace, control or
        format characters), and a request cut into more than ``limits.max_chunks`` windows."""
        pool = self._runtime.pool
        if pool is None:
            raise RuntimeError("no tokenizer: set tokenizer.path in service.yaml")
        chunks = await pool.chunk(self.chunker, list(texts))
        empty = np.flatnonzero(chunks.doc_token_counts == 0)
        if empty.size:
            raise ServiceError(
                422,
                "text has no token the model reads (only whitespace, control or format characters)",
                field=f"{field}[{int(empty[0])}]",
            )
        limit = self.config.limits.max_chunks
        if len(chunks) > limit:
            sizes = [len(span) for span in chunks.spans]
            biggest = int(np.argmax(sizes))
            window = f"windows of at most {self.chunker.max_tokens} tokens"
            if sizes[biggest] > limit:
                raise ServiceError(
                    422,
                    f"text of {int(chunks.doc_token_counts[biggest])} tokens is cut into {sizes[biggest]} {window}; "
                    f"at most {limit} windows in one request",
                    field=f"{field}[{biggest}]",
                )
            raise ServiceError(
                422, f"the texts are cut into {len(chunks)} {window}; at most {limit} in one request", field=field
            )
        return chunks

    def check_texts(self, texts: Sequence[str], field: str = "texts") -> None:
        """Refuse what the limits in service.yaml forbid, naming the field: empty text, too long, too many."""
        limits = self.config.limits
        if not texts:
            raise ServiceError(422, "at least one text is needed", field=field)
        if len(texts) > limits.max_documents:
            raise ServiceError(422, f"{len(texts)} texts, at most {limits.max_documents} in one request", field=field)
        for i, text in enumerate(texts):
            if not text.strip():
                raise ServiceError(422, "text is empty", field=f"{field}[{i}]")
            if len(text) > limits.max_text_chars:
                raise ServiceError(
                    422, f"text has {len(text)} characters, at most {limits.max_text_chars}", field=f"{field}[{i}]"
                )

    async def infer_chunks(
        self, model: str, chunks: Chunks, output: str, *, max_batch_size: int | None = None
    ) -> np.ndarray[Any, Any]:
        """Run every chunk through ``model``, concurrently; one row of ``output`` per chunk, in chunk order.

        In as few calls as its max_batch_size allows, each padded to its longest chunk; or, when the model's
        config has ``pad_inputs`` (the server pads), one call per chunk at its own length, at most twice
        max_batch_size in flight, which the server batches. An output with the token axis then comes back
        zero-filled past each chunk's length."""
        handle = self.model(model)
        padding = self._runtime.padding.get(model)
        self.rows += len(chunks)
        self.tokens += sum(len(ids) for ids in chunks.input_ids)
        return await infer_chunks(handle, chunks, output, max_batch_size=max_batch_size, padding=padding)

    async def infer_sequence(
        self, model: str, chunks: Chunks, output: str, *, restarts: int = 1
    ) -> np.ndarray[Any, Any]:
        """One row of ``output`` per document from a stateful model (Triton's sequence batcher): each document's
        windows go in order as one sequence (start on the first, end on the last), and its row is the answer to
        its last window, the model's running state at the end of the document (see ``_sequence``)."""
        handle = self.model(model)
        if self._runtime.client is None:
            raise ServerUnavailable("the model service client is not started")
        self.rows += len(chunks)
        self.tokens += sum(len(ids) for ids in chunks.input_ids)
        return await infer_sequences(self._runtime.client, handle, chunks, output, restarts=restarts)

    async def stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        render: Callable[[InferResult], Any] | None = None,
    ) -> ServerSentEvent:
        """The model's streamed responses (a decoupled model over gRPC) as server-sent events for the caller:
        return it from a handler annotated ``-> ServerSentEvent``. A model failing before its first response
        raises as any model call (problem+json); later errors end the stream with an ``error`` event; the caller
        disconnecting cancels the model's stream (see ``_stream``)."""
        handle = self.model(model)
        if self._runtime.client is None:
            raise ServerUnavailable("the model service client is not started")
        try:
            return await stream_events(
                self._runtime.client,
                handle.name,
                inputs,
                version=handle.version,
                outputs=outputs,
                parameters=parameters,
                render=render,
            )
        except StreamingUnsupported as exc:  # the service's configuration, not the model service: a 500, logged
            raise RuntimeError(
                f"route {self.route}: streaming from model {model!r} needs model_service.url: grpc://... ({exc})"
            ) from exc

    @contextlib.asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[None]:
        """Time a stage (pre-process, model, post-process...): a span, a metric and an entry in `timings`."""
        start = time.perf_counter()
        with self._runtime.tracer.start_as_current_span(name):
            try:
                yield
            finally:
                elapsed = time.perf_counter() - start
                self.timings[name] = self.timings.get(name, 0.0) + elapsed
                self._runtime.metrics.stages.labels(self.route, name).observe(elapsed)
