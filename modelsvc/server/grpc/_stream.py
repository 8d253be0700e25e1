"""gRPC ``ModelStreamInfer``: one bidirectional stream, many requests in flight, decoupled models' responses as sent.

Both gRPC engines (``h2`` and ``grpcio``) run this through ``InferenceService.ModelStreamInfer``. Three tasks share
a stream: the reader takes requests (up to ``STREAM_WINDOW`` unanswered at a time, then it stops reading: flow
control), the writer writes every message the others queue, in the order they queue them, and each request runs
on its own:

- A request to a model that is not decoupled gets exactly one answer, marked ``triton_final_response: true``;
  these answers go out in the order their requests came (a slow request holds back those after it, as in Triton).
- A request to a decoupled model (``model_transaction_policy { decoupled: true }``) gets each response as the
  model sends it, in the order it sends them; the responses of different requests interleave. Each carries
  ``triton_final_response`` (true on the one sent with the final flag). A final flag sent without a response
  writes nothing, unless the request asked for it with the parameter ``triton_enable_empty_final_response: true``:
  then an empty response (id, model name and version, no outputs) marked final. A response the model fails (a
  ``TritonError``, outputs that break the config) is written with ``error_message`` set; the request goes on.

A request that fails before it runs gets one answer with ``error_message`` set; the stream goes on. When the
server drains, the stream stops reading, answers what it has read, and ends with UNAVAILABLE if the client had
not closed its side. When the client goes away (it cancels the stream or its connection closes) every request
still running is cancelled: a decoupled model's ``is_cancelled()`` turns true, and those still queued never run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

import grpc
from tritonclient.grpc import service_pb2

from ...engine._dataplane import is_decoupled
from ...protocol import ModelsvcError
from ._codec import decode_infer_request, encode_infer_response
from ._status import SHUTTING_DOWN, Context, _abort, _end_trace, grpc_status


class InferenceService(Protocol):
    """What a stream needs of the gRPC service (``_service.InferenceService``)."""

    draining: bool
    dataplane: Any
    _stream_readers: set[asyncio.Task[None]]

    async def _stream_answer(self, message: Any, headers: Sequence[tuple[bytes, bytes]]) -> Any: ...


STREAM_WINDOW = 128
"""How many requests of one stream may be unanswered at once; beyond that the stream is not read (flow control)."""

EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"

_DONE: Any = object()


async def serve_stream(
    service: InferenceService, request_iterator: Any, context: Context, headers: Sequence[tuple[bytes, bytes]]
) -> None:
    """Answer every request of one ``ModelStreamInfer`` call (see the module's description)."""

    out: asyncio.Queue[Any] = asyncio.Queue()  # (message or None, frees a window slot) ..., then _DONE
    ordered: asyncio.Queue[asyncio.Future[Any] | None] = asyncio.Queue()
    window = asyncio.Semaphore(STREAM_WINDOW)
    running: set[asyncio.Task[None]] = set()

    async def decoupled(message: Any) -> None:
        final = False
        try:
            async with contextlib.aclosing(_responses(service, message, headers)) as responses:
                async for answer, final in responses:
                    out.put_nowait((answer, final))
        finally:
            if not final:  # cancelled: the slot is free all the same
                out.put_nowait((None, True))

    async def read() -> None:
        try:
            if service.draining:
                raise asyncio.CancelledError
            iterator = request_iterator.__aiter__()
            while True:
                await window.acquire()  # taken before reading, so a cancelled reader holds no unanswered request
                try:
                    message = await iterator.__anext__()
                except StopAsyncIteration:
                    window.release()
                    break
                if _to_decoupled(service, message):
                    task = asyncio.ensure_future(decoupled(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                else:
                    ordered.put_nowait(asyncio.ensure_future(service._stream_answer(message, headers)))
        finally:
            ordered.put_nowait(None)

    async def in_order() -> None:
        while (pending := await ordered.get()) is not None:
            out.put_nowait((await pending, True))

    async def finish() -> None:
        await asyncio.wait({reader})
        await orderer
        while running:
            await asyncio.wait(set(running))
        out.put_nowait(_DONE)

    reader = asyncio.ensure_future(read())
    orderer = asyncio.ensure_future(in_order())
    finisher = asyncio.ensure_future(finish())
    service._stream_readers.add(reader)
    try:
        while (item := await out.get()) is not _DONE:
            answer, frees = item
            if answer is not None:
                await context.write(answer)
            if frees:
                window.release()
        if reader.cancelled():  # the server drains and the client had more to say
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        error = reader.exception()
        if error is not None:
            await _abort(context, error)
    finally:
        service._stream_readers.discard(reader)
        for task in (reader, finisher, orderer, *running):
            task.cancel()
        while not ordered.empty():  # the client went away: withdraw what is still queued
            left = ordered.get_nowait()
            if left is not None:
                left.cancel()


def _to_decoupled(service: InferenceService, message: Any) -> bool:
    try:
        return is_decoupled(service.dataplane.models.get(message.model_name, message.model_version or None))
    except ModelsvcError:
        return False  # answered on the ordered path, with the error


def _bare(message: Any, final: bool, error: str = "") -> Any:
    """An answer with no outputs: the request's id, model name and version (an error, or an empty final)."""
    answer = service_pb2.ModelInferResponse(
        id=message.id, model_name=message.model_name, model_version=message.model_version
    )
    answer.parameters[FINAL].bool_param = final
    return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=answer)


async def _responses(
    service: InferenceService, message: Any, headers: Sequence[tuple[bytes, bytes]]
) -> AsyncGenerator[tuple[Any, bool], None]:
    """One request to a decoupled model: (message to write or None, final) for each response the model sends."""

    dataplane = service.dataplane
    model, version = message.model_name, message.model_version or None
    tracing = dataplane.tracing
    trace = None if tracing is None else tracing.start(model, version, headers)
    flag = message.parameters.get(EMPTY_FINAL)
    empty_final = flag is not None and flag.bool_param
    try:
        request = decode_infer_request(message)
        if trace is not None:
            trace.request(request.id)
        async with contextlib.aclosing(dataplane.infer_stream(model, version, request, trace)) as responses:
            async for response, final in responses:
                if response is None:
                    yield (_bare(message, True) if empty_final else None), final
                elif isinstance(response, ModelsvcError):
                    _, text = grpc_status(response)
                    yield _bare(message, final, text), final
                else:
                    answer = encode_infer_response(response)
                    answer.parameters[FINAL].bool_param = final
                    yield service_pb2.ModelStreamInferResponse(infer_response=answer), final
    except Exception as exc:
        code, text = grpc_status(exc)  # once: it logs an unexpected error
        if trace is not None:
            _end_trace(trace, exc, code)
            trace = None
        yield _bare(message, True, text), True
    except BaseException as exc:
        if trace is not None:
            _end_trace(trace, exc, grpc.StatusCode.CANCELLED)
            trace = None
        raise
    if trace is not None:
        _end_trace(trace, None, grpc.StatusCode.OK)
