"""A model's streamed responses passed on to the caller as server-sent events.

    @service.post("/v1/generate")
    async def generate(request: Prompt, ctx: Context) -> ServerSentEvent:
        return await ctx.stream("generator", {"PROMPT": [request.text]})

``ctx.stream`` opens the model's stream (gRPC ModelStreamInfer: the model service URL must be ``grpc://``) and
waits for its first response, so a model that fails at once answers the caller with the usual problem+json
(503, 422, 502...). Then every response becomes one event (``data:`` the JSON of ``render(result)``, by default
each output's values by name; ``id:`` its index) as the model sends it. An error the model sends later becomes
a last event ``event: error`` whose data is a problem object (``status``, ``title``, ``detail``), and the stream
ends. When the caller disconnects, the model's stream is cancelled: a decoupled model sees ``is_cancelled()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from modelsvc.client import AsyncClient, ClientError, InferResult, StreamError

from ._problems import client_error_status, problem

__all__ = ["Render", "default_render", "stream_events"]

Render = Callable[[InferResult], Any]
"""What one response becomes: anything msgspec encodes as JSON (or a str, sent as it is)."""


def _plain(array: np.ndarray[Any, Any]) -> Any:
    if array.dtype == object:
        return [b.decode("utf-8", "replace") if isinstance(b, bytes) else b for b in array.reshape(-1)]
    return array.tolist()


def default_render(result: InferResult) -> dict[str, Any]:
    """Each output's values by name (BYTES as text, flattened)."""
    return {name: _plain(np.asarray(value)) for name, value in result.outputs.items()}


def _message(index: int, result: InferResult, render: Render) -> ServerSentEventMessage:
    value = render(result)
    data = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return ServerSentEventMessage(data=data, id=index)


async def stream_events(
    client: AsyncClient,
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: str | None = None,
    outputs: Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    render: Render | None = None,
) -> ServerSentEvent:
    """The model's responses to ``inputs`` as a server-sent-event response (see the module). Raises the
    client's error when the stream fails before its first response."""
    show = render or default_render
    responses = client.stream_infer(model, inputs, version=version, outputs=outputs, parameters=parameters)
    try:
        first: InferResult | None = await responses.__anext__()
    except StopAsyncIteration:
        first = None

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        index = 0
        try:
            if first is None:
                return
            yield _message(index, first, show)
            async for result in responses:
                index += 1
                yield _message(index, result, show)
        except ClientError as exc:
            status, detail, _ = client_error_status(exc)
            if isinstance(exc, StreamError):  # the model's own error, sent in its stream: the caller may read it
                detail = f"the model failed mid-stream: {exc.message}"
            yield ServerSentEventMessage(data=msgspec.json.encode(problem(status, detail)).decode(), event="error")
        finally:
            responses.cancel()  # the caller left (or the stream ended: then nothing happens)

    return ServerSentEvent(events(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
