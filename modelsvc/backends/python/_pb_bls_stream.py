"""BLS requests to decoupled models: ``request.exec(decoupled=True)`` and ``await request.async_exec(decoupled=True)``.

As in Triton's python backend, ``exec(decoupled=True)`` returns an iterator of ``InferenceResponse``: each response
the called model sends, as it sends it (the iterator waits for the next one), and, when the model sent the final
flag without a response, a last response with no outputs. A response the model failed has ``has_error()``; a
request that fails before the model answers (unknown model, bad input, full queue, the request's ``timeout``
passed) gives one response with the error. ``async_exec(decoupled=True)`` resolves, once the final response has
arrived, to an iterator over all of them. A model that is not decoupled answers with its one response. The
request runs through the server's data plane in-process (``DataPlane.infer_stream``), as a gRPC stream's would.
The ``request`` these functions take is a ``_pb_bls.BLSRequest``, typed ``Any`` here: that module imports this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

from modelsvc.protocol import InferResponse, ModelsvcError

from ._pb_errors import _triton_from_error
from ._pb_response import InferenceResponse, _response_from

_END: Any = object()


def stream_exec(request: Any) -> Iterator[InferenceResponse]:
    """``exec(decoupled=True)``: the responses as they come, on the calling (model's) thread."""
    prepared = request._prepare()
    if isinstance(prepared, InferenceResponse):
        return iter([prepared])
    binding, wire = prepared
    refused = request._refuse_blocking(binding)
    if refused is not None:
        return iter([refused])
    arrived: queue.SimpleQueue[Any] = queue.SimpleQueue()
    pump = asyncio.run_coroutine_threadsafe(_pump(request, binding.target, wire, arrived.put), binding.loop)
    return _ResponseIterator(request, arrived, pump)


def stream_async_exec(request: Any, here: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """``async_exec(decoupled=True)``: an awaitable of an iterator over every response."""
    prepared = request._prepare()
    if isinstance(prepared, InferenceResponse):
        ready: asyncio.Future[Any] = here.create_future()
        ready.set_result(iter([prepared]))
        return ready
    binding, wire = prepared
    collected: list[Any] = []
    pending = request._start(binding, _pump(request, binding.target, wire, collected.append), here)

    async def finish() -> Iterator[InferenceResponse]:
        try:
            if request._timeout_us > 0:
                await asyncio.wait_for(pending, request._timeout_us / 1e6)
            else:
                await pending
        except TimeoutError:
            collected[:] = [r for r in collected if r is not _END] + [request._timed_out()]
        return iter([r for r in collected if r is not _END])

    return here.create_task(finish())


async def _pump(request: Any, target: Any, wire: Any, put: Callable[[Any], None]) -> None:
    """On the server's loop: each response of the stream, converted, then ``_END``."""
    try:
        stream = getattr(target, "infer_stream", None)
        if stream is None:  # a target without streams: its one answer
            put(_response_from(await target.infer(request._model_name, request._version(), wire)))
            return
        async with contextlib.aclosing(stream(request._model_name, request._version(), wire)) as responses:
            async for response, _final in responses:
                put(_convert(response))
    except Exception as exc:
        put(request._failure(exc))
    finally:
        put(_END)


def _convert(response: InferResponse | ModelsvcError | None) -> InferenceResponse:
    if response is None:
        return InferenceResponse()  # the final flag without a response: an empty last response, as in Triton
    if isinstance(response, ModelsvcError):
        return InferenceResponse(error=_triton_from_error(response))
    return _response_from(response)


class _ResponseIterator:
    """The responses of one ``exec(decoupled=True)``; waiting for the next one blocks the model's thread (up to
    the request's timeout, counted from the call)."""

    def __init__(self, request: Any, arrived: queue.SimpleQueue[Any], pump: Any) -> None:
        self._request = request
        self._arrived = arrived
        self._pump = pump
        self._done = False
        timeout_us = request._timeout_us
        self._deadline = time.monotonic() + timeout_us / 1e6 if timeout_us > 0 else None

    def __iter__(self) -> _ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        try:
            wait = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            item = self._arrived.get(timeout=wait)
        except queue.Empty:
            self._done = True
            self._pump.cancel()  # the data plane's stream closes: the called model sees is_cancelled()
            timed_out: InferenceResponse = self._request._timed_out()
            return timed_out
        if item is _END:
            self._done = True
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def __del__(self) -> None:
        if not self._done:
            self._pump.cancel()  # dropped before its end: the rest is not wanted
