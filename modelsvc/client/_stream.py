"""Streamed responses (Triton's decoupled models): one request, zero or more responses, over gRPC ModelStreamInfer.

    async for result in client.stream_infer("generate", {"PROMPT": ["..."]}):
        print(result["TOKEN"])

Each call opens its own bidirectional ``ModelStreamInfer`` stream, sends the one request with Triton's
``triton_enable_empty_final_response: true`` and yields every response as the server writes it, until the
response marked ``triton_final_response: true`` (a final response without outputs, the "empty final response",
ends the loop without being yielded). A non-decoupled model answers once, marked final: one result.

- An error the server sends in the stream (``error_message``) raises ``StreamError``; a broken connection
  ``ConnectionLost``; the stream running past the call's timeout ``Timeout`` (the timeout bounds the whole
  stream, as the gRPC deadline of the one call).
- Leaving the loop early (``break``, an exception, ``aclose()``, or leaving ``async with``) cancels the gRPC call,
  so a decoupled model sees ``is_cancelled()`` turn true and can stop generating.
- A stream that could not connect (nothing was sent) is opened again under the client's retry policy; once a
  response arrived nothing is retried.
- Tracing: one CLIENT span ``infer {model}`` (``rpc.method`` ModelStreamInfer) from opening to the end of the
  stream, with the number of responses as ``modelsvc.responses``.

``Client.stream_infer`` is the same as an iterator (``for result in ...``), over grpcio's sync API. HTTP has no
ModelStreamInfer: ``stream_infer`` on an ``http://`` client raises ``StreamingUnsupported``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

import grpc
import grpc.aio
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Status, StatusCode

from ._core import Attempts, InferCall, InferResult
from ._errors import ClientError, ConnectionLost, ServerError
from ._tracing import ATTR_OUTCOME, start_span

__all__ = [
    "ENABLE_EMPTY_FINAL",
    "FINAL_RESPONSE",
    "ResponseStream",
    "StreamCall",
    "StreamError",
    "StreamingTransport",
    "StreamingUnsupported",
    "SyncResponseStream",
    "SyncStreamCall",
    "SyncStreamingTransport",
]

FINAL_RESPONSE = "triton_final_response"
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
ATTR_RESPONSES = "modelsvc.responses"


class StreamError(ServerError):
    """The server sent an error in the stream (``ModelStreamInferResponse.error_message``)."""


class StreamingUnsupported(ClientError):
    """The binding cannot stream responses (HTTP, an in-process engine): use a ``grpc://`` URL."""


class StreamCall(Protocol):
    """One open stream: ``next()`` gives each response, None after the final one; ``cancel()`` ends it."""

    async def next(self) -> InferResult | None: ...
    def cancel(self) -> None: ...
    async def close(self) -> None:
        """The final response was read: finish the call without cancelling it."""
        ...


class SyncStreamCall(Protocol):
    """``StreamCall`` for the sync client."""

    def next(self) -> InferResult | None: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class StreamingTransport(Protocol):
    """An ``AsyncTransport`` that streams (the gRPC binding, and replicas of it)."""

    def open_stream(self, call: InferCall) -> StreamCall: ...


@runtime_checkable
class SyncStreamingTransport(Protocol):
    """A ``Transport`` that streams (the sync gRPC binding)."""

    def open_stream(self, call: InferCall) -> SyncStreamCall: ...


def stream_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request's parameters with the empty final response asked for (so the end of a stream is known)."""
    return {**(parameters or {}), ENABLE_EMPTY_FINAL: True}


def read_stream_response(message: Any, parse: Callable[[Any], InferResult]) -> tuple[InferResult | None, bool]:
    """One ``ModelStreamInferResponse``: (the result to yield or None for an empty final one, whether it is final).

    A response without the ``triton_final_response`` parameter is final (a server that does not mark responses
    answers each request once)."""
    if message.error_message:
        raise StreamError(message.error_message)
    response = message.infer_response
    params = response.parameters
    final = params[FINAL_RESPONSE].bool_param if FINAL_RESPONSE in params else True
    if final and not response.outputs:
        return None, True
    return parse(response), final


class GrpcStreamCall:
    """A ``ModelStreamInfer`` call carrying one request (``StreamCall`` over grpc.aio)."""

    def __init__(
        self,
        open_call: Callable[[], Any],
        request: Any,
        parse: Callable[[Any], InferResult],
        error: Callable[[grpc.RpcError], ClientError],
    ) -> None:
        self._open = open_call
        self._request = request
        self._parse = parse
        self._error = error
        self._call: Any = None
        self._final = False

    async def next(self) -> InferResult | None:
        while not self._final:
            try:
                if self._call is None:
                    self._call = self._open()
                    await self._call.write(self._request)
                message = await self._call.read()
            except grpc.RpcError as exc:
                raise self._error(exc) from exc
            if message is grpc.aio.EOF:
                raise ConnectionLost("the stream ended before its final response")
            result, self._final = read_stream_response(message, self._parse)
            if result is not None:
                return result
        return None

    async def close(self) -> None:
        if self._call is not None:
            try:
                await self._call.done_writing()
            except grpc.RpcError:
                self._call.cancel()

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()


class SyncGrpcStreamCall:
    """A ``ModelStreamInfer`` call carrying one request over grpcio's sync API (``SyncStreamCall``): the request
    side stays open until the final response, then closes."""

    def __init__(
        self,
        open_call: Callable[[Iterator[Any]], Any],
        request: Any,
        parse: Callable[[Any], InferResult],
        error: Callable[[grpc.RpcError], ClientError],
    ) -> None:
        self._open = open_call
        self._request = request
        self._parse = parse
        self._error = error
        self._call: Any = None
        self._final = False
        self._finished = threading.Event()

    def _requests(self) -> Iterator[Any]:
        yield self._request
        self._finished.wait()

    def next(self) -> InferResult | None:
        while not self._final:
            try:
                if self._call is None:
                    self._call = self._open(self._requests())
                message = next(self._call)
            except StopIteration:
                raise ConnectionLost("the stream ended before its final response") from None
            except grpc.RpcError as exc:
                raise self._error(exc) from exc
            result, self._final = read_stream_response(message, self._parse)
            if result is not None:
                return result
        return None

    def close(self) -> None:
        self._finished.set()

    def cancel(self) -> None:
        self._finished.set()
        if self._call is not None:
            self._call.cancel()


def _start_span(model: str, version: str | None, transport: str, server: str) -> Span | None:
    span = start_span(model, version, transport=transport, server=server, method="ModelStreamInfer")
    return span if span.get_span_context().is_valid else None


class _Stream:
    """What both response streams share: opening the call under the retry policy, the span, and the end."""

    def __init__(
        self,
        open_call: Callable[[dict[str, str], float | None], Any],
        attempts: Callable[[], Attempts],
        span: Callable[[], Span | None],
    ) -> None:
        self._open = open_call
        self._attempts = attempts
        self._make_span = span
        self._call: Any = None
        self._tries: Attempts | None = None
        self._span: Span | None = None
        self._headers: dict[str, str] = {}
        self.responses = 0
        """Responses yielded so far."""
        self._done = False

    def _start(self) -> Any:
        if self._tries is None:
            self._tries = self._attempts()
            self._span = self._make_span()
            if self._span is not None:
                propagate.inject(self._headers, context=trace.set_span_in_context(self._span))
        self._call = self._open(self._headers, self._tries.remaining())
        return self._call

    def _retry_delay(self, call: Any, error: ClientError) -> float:
        """After ``call`` failed before its first response: the pause before opening it again (raises
        ``error`` when the retry policy says no; nothing is retried once a response arrived)."""
        assert self._tries is not None
        if self.responses:
            raise error
        self._call = None
        call.cancel()
        return self._tries.after_failure(error)

    def _finish(self, exc: BaseException | None) -> None:
        """End the stream (cancelling a call still open) and its span, once."""
        if self._done:
            return
        self._done = True
        if exc is not None and self._call is not None:
            self._call.cancel()
        span, self._span = self._span, None
        if span is None:
            return
        if span.is_recording():
            span.set_attribute(ATTR_RESPONSES, self.responses)
            if exc is None:
                span.set_attribute(ATTR_OUTCOME, "ok")
            elif isinstance(exc, asyncio.CancelledError | GeneratorExit):
                span.set_attribute(ATTR_OUTCOME, "cancelled")
            else:
                name = type(exc).__qualname__
                span.set_attributes({ATTR_OUTCOME: "error", "error.type": name})
                span.set_status(Status(StatusCode.ERROR, f"{name}: {exc}"))
        span.end()

    def cancel(self) -> None:
        """Stop reading: a stream not yet at its final response is cancelled (nothing to await: safe in a
        ``finally`` of a task being cancelled)."""
        if not self._done:
            self._finish(asyncio.CancelledError("the caller stopped reading the stream"))

    def __del__(self) -> None:
        if not self._done and self._call is not None:
            self._finish(asyncio.CancelledError("the stream was dropped before its end"))


class ResponseStream(_Stream):
    """What ``AsyncClient.stream_infer`` returns: an async iterator of ``InferResult`` (also ``async with``).

    Nothing is sent before the first ``__anext__``; leaving early cancels the call (``aclose``, ``cancel``; also
    when the object is dropped mid-stream)."""

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> InferResult:
        if self._done:
            raise StopAsyncIteration
        try:
            while True:
                call: StreamCall = self._call or self._start()
                try:
                    result = await call.next()
                    break
                except ClientError as error:
                    await asyncio.sleep(self._retry_delay(call, error))
        except BaseException as exc:
            self._finish(exc)
            raise
        if result is None:
            await call.close()
            self._finish(None)
            raise StopAsyncIteration
        self.responses += 1
        return result

    async def aclose(self) -> None:
        """``cancel()``, awaitable (for ``contextlib.aclosing``)."""
        self.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()


class SyncResponseStream(_Stream):
    """What ``Client.stream_infer`` returns: an iterator of ``InferResult`` (also ``with``); the same rules."""

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> InferResult:
        if self._done:
            raise StopIteration
        try:
            while True:
                call: SyncStreamCall = self._call or self._start()
                try:
                    result = call.next()
                    break
                except ClientError as error:
                    time.sleep(self._retry_delay(call, error))
        except BaseException as exc:
            self._finish(exc)
            raise
        if result is None:
            call.close()
            self._finish(None)
            raise StopIteration
        self.responses += 1
        return result

    def close(self) -> None:
        """``cancel()``, under the name ``contextlib.closing`` calls."""
        self.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()
