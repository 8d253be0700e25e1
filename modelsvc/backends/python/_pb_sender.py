"""pb_utils ``InferenceResponseSender``: how a decoupled python model answers a request, and how its ``execute``
runs (``run_decoupled``).

As in Triton's python backend: ``request.get_response_sender()`` gives the request's sender (the same object
each time); ``send(response=None, flags=0)`` sends one response, ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL``
closes the stream of responses (with a last response, or with none); sending after that raises
``TritonModelException("Unable to send response. Response sender has been closed.")``. ``is_cancelled()`` is
true once the client went away; the model should still send the final flag. A response may be sent from the
execute thread or from any thread, after ``execute`` returned too. A response whose outputs break the
configuration (a missing requested output, a wrong datatype or shape) reaches the client as that response's
error, as does a response carrying a ``TritonError``; the stream goes on.

Safety net (not in Triton): a sender dropped without its final flag (the model forgot it, or its thread died)
closes the stream with an error when Python collects it, so that the client is not left waiting forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

from modelsvc.protocol import InternalError, ModelsvcError

from .._decoupled import Arrays, ResponseChannel
from ._pb_errors import TritonModelException
from ._pb_response import TRITONSERVER_RESPONSE_COMPLETE_FINAL, InferenceResponse

logger = logging.getLogger("modelsvc.backends.python")

#: turns a model's InferenceResponse into the request's outputs, or the error that fails that response
Conform = Callable[[Any], "Arrays | ModelsvcError"]


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model (``request.get_response_sender()``)."""

    __slots__ = ("__weakref__", "_channel", "_closed", "_conform", "_label", "_lock")

    def __init__(self, channel: ResponseChannel | None, conform: Conform, label: str) -> None:
        self._channel = channel  # None: a request with nobody to answer (a warmup); responses are checked, then dropped
        if channel is not None:
            channel.started()
        self._conform = conform
        self._label = label
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response``; ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` makes it the last (``response``
        may then be None)."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Unable to send response. Expected a pb_utils.InferenceResponse, got {type(response).__name__}."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:  # two threads of the model sending at once still send one after the other
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            start = perf_counter_ns()
            outcome = None if response is None else self._conform(response)
            if self._channel is not None:
                self._channel.put(outcome, final, perf_counter_ns() - start)

    def is_cancelled(self) -> bool:
        """True once the request's client went away (the stream was cancelled or its connection closed)."""
        return self._channel is not None and self._channel.cancelled

    @property
    def closed(self) -> bool:
        return self._closed

    def _fail(self, error: ModelsvcError) -> None:
        """Close the stream with ``error`` unless the model closed it already (execute failed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._channel is not None:
                self._channel.put(error, True)

    def __del__(self) -> None:
        if not self._closed and self._channel is not None and not self._channel.cancelled:
            logger.error("model '%s' dropped a response sender without sending the final flag", self._label)
            self._fail(InternalError(f"model '{self._label}' ended the request without sending the final flag"))


def run_decoupled(
    execute: Callable[[list[Any]], Any],
    requests: list[Any],
    senders: Sequence[InferenceResponseSender],
    instance: str,
    run_async: Callable[[Any], concurrent.futures.Future[Any]],
    execute_is_async: bool,
) -> None:
    """Call a decoupled model's ``execute`` on the batch's requests (``instance``: the instance's name, which
    Triton's messages name).

    A plain ``execute`` runs to its end here (the instance is busy until it returns); a coroutine (``async def
    execute``) is started on the instance's event loop and left running, as in Triton, so that the instance
    takes its next batch while it waits. Either way, ``execute`` raising, or returning something other than
    None, closes every stream it left open with that error, in Triton's words.
    """
    label = instance
    try:
        result = execute(requests)
        if asyncio.iscoroutine(result) or execute_is_async:
            future = run_async(result)
            future.add_done_callback(lambda done: _settle(done, senders, label))
            return
    except Exception as exc:
        _fail_all(senders, _execute_error(exc, label))
        return
    _check_returned(result, senders, label)


def _settle(done: concurrent.futures.Future[Any], senders: Sequence[InferenceResponseSender], label: str) -> None:
    if done.cancelled():
        _fail_all(senders, InternalError(_failed_to_process(label, "execute() was cancelled (the model is unloading)")))
        return
    exc = done.exception()
    if exc is not None:
        _fail_all(senders, _execute_error(exc, label))
        return
    _check_returned(done.result(), senders, label)


def _check_returned(result: Any, senders: Sequence[InferenceResponseSender], label: str) -> None:
    if result is not None:
        what = f"Python model '{label}' is using the decoupled mode and the execute function must return None."
        logger.error("%s", what)
        _fail_all(senders, InternalError(_failed_to_process(label, what)))


def _failed_to_process(instance: str, what: str) -> str:
    return f"Failed to process the request(s) for model '{instance}', message: {what}"


def _execute_error(exc: BaseException, label: str) -> ModelsvcError:
    if isinstance(exc, TritonModelException):
        logger.error("model instance '%s': execute() raised: %s", label, exc.message())
        return InternalError(_failed_to_process(label, exc.message()))
    logger.error("model instance '%s': execute() raised", label, exc_info=exc)
    return InternalError(_failed_to_process(label, f"{type(exc).__name__} (see the server log)"))


def _fail_all(senders: Sequence[InferenceResponseSender], error: ModelsvcError) -> None:
    for sender in senders:
        sender._fail(error)
