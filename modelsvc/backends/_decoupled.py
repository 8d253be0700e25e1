"""What a decoupled model's request carries to its instance: a channel for its responses back to the event loop.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a request with zero, one or many
responses, from its execute thread or from any thread after ``execute`` returned. The data plane hands the
scheduler a :class:`DecoupledRequest` (an ``InferRequest`` with its :class:`ResponseChannel`); the scheduler
batches it like any request, and the python backend's response sender puts each response into the channel
(``loop.call_soon_threadsafe``), where the data plane's stream reads them in the order they were sent.

The channel also carries the other direction: ``cancel()`` (the client went away) makes ``cancelled`` true,
which the model reads with ``is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import numpy as np

from modelsvc.protocol import InferRequest

Arrays = dict[str, np.ndarray[Any, Any]]


class Failed:
    """In the channel, last: the request failed outside the model (a full queue, a timeout, a closed instance)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


#: one response: its outputs, or the error that fails it; None for a final flag sent without a response
Sent = Arrays | BaseException | Failed | None


class ResponseChannel:
    """The responses of one request to a decoupled model, from the model's threads to the event loop."""

    __slots__ = ("_loop", "_queue", "cancelled", "complete", "mark_ns", "sent")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[Sent, bool, int, int]] = asyncio.Queue()
        self.cancelled = False
        """True once the request's caller went away (or the stream was cancelled)."""
        self.complete = False
        """True once the final flag was sent (set on the sending thread)."""
        self.sent = 0
        """Responses sent so far, the final flag's included."""
        self.mark_ns = perf_counter_ns()
        """When the model began its next response: the start of execute, then each response's send."""

    def started(self) -> None:
        """The model's execute began (on the instance's thread)."""
        self.mark_ns = perf_counter_ns()

    def put(self, response: Sent, final: bool, output_ns: int = 0) -> None:
        """Send one response (from any thread); ``final``: the last one; ``output_ns``: the time taken to check
        its outputs. Its compute time is the time since the last response (or since execute began)."""
        now = perf_counter_ns()
        infer_ns = now - output_ns - self.mark_ns
        self.mark_ns = now
        self.sent += 1
        if final:
            self.complete = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone, nobody listens
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (response, final, infer_ns, output_ns))

    def fail(self, error: BaseException) -> None:
        """The request failed before its model could answer it (on the event loop)."""
        self._queue.put_nowait((Failed(error), True, 0, 0))

    async def get(self) -> tuple[Sent, bool, int, int]:
        """The next response, whether it is the final one, its compute and output times (on the event loop)."""
        return await self._queue.get()

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(slots=True)
class DecoupledRequest(InferRequest):
    """A request to a decoupled model: the request as received, and where its responses go."""

    responses: ResponseChannel | None = None


def channel_of(request: Any) -> ResponseChannel | None:
    """The response channel a request carries (None: an ordinary request, or a decoupled model's warmup)."""
    return request.responses if isinstance(request, DecoupledRequest) else None
