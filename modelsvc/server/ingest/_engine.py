"""The engine's end of the ingest channel: a Unix socket every worker connects to, one ``WorkerLink`` each.

A link takes the worker's calls (decoded in C by msgspec, tensors as views on the frame or on the worker's arena),
runs each as its own task through the one data plane (so the dynamic batcher sees the requests of every worker
together), and writes the replies, collected within one turn of the event loop into one write. A worker that goes
away takes its requests with it: those still running are cancelled (withdrawn when still queued).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import TYPE_CHECKING, Any, cast

import grpc

from ...engine import DecoupledRefused, http_error
from ...protocol import Cancelled, ModelsvcError
from ..grpc._status import _code, _end_trace
from ._arena import ArenaView, OwnedArena
from ._wire import (
    Call,
    Cancel,
    FrameReader,
    Hello,
    Listening,
    Outbox,
    Release,
    Welcome,
    decode_to_engine,
    error_reply,
    reply_for,
    request_of,
)

if TYPE_CHECKING:
    from ...engine import DataPlane

logger = logging.getLogger("modelsvc.ingest")


class EngineChannel:
    """Listens on ``path`` for the ingest workers and serves their calls through ``dataplane``."""

    def __init__(self, dataplane: DataPlane, path: str) -> None:
        self.dataplane = dataplane
        self.path = path
        self.arenas: dict[int, tuple[ArenaView, OwnedArena]] = {}
        """Each worker's arenas (its inputs, read here; its outputs, written here), by index: made when it starts."""
        self.links: set[WorkerLink] = set()
        self.changed = asyncio.Event()
        """Set when a worker starts listening (``listening`` counts them)."""
        self.calls: dict[int, int] = {}
        """Inference calls received from each worker (by its index), over all its lives."""
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: WorkerLink(self, loop), self.path)
        os.chmod(self.path, 0o600)

    @property
    def listening(self) -> int:
        """Workers connected whose ports are open."""
        return sum(1 for link in self.links if link.listening)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.close()


class WorkerLink(asyncio.Protocol):
    """One worker's connection."""

    def __init__(self, channel: EngineChannel, loop: asyncio.AbstractEventLoop) -> None:
        self.channel = channel
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.inputs: ArenaView | None = None
        self.outputs: OwnedArena | None = None
        self.pid = 0
        self.index = -1
        self.listening = False
        self.outbox = Outbox(loop)

    # -- the socket -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.outbox.transport = self.transport
        self.channel.links.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel.links.discard(self)
        self.transport = self.outbox.transport = None
        for task in list(self.tasks.values()):
            task.cancel()  # nobody is left to answer: a queued request is withdrawn, a running one is dropped

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
            for body in frames:
                self._take(decode_to_engine(body))
        except Exception:  # a worker is ours: a frame we cannot read is a bug, and the link is done
            logger.exception("ingest worker %d sent a frame the engine cannot read; closing its link", self.pid)
            self.close()

    def _send(self, message: Any) -> None:
        self.outbox.send(message)

    # -- messages ---------------------------------------------------------------------------------------------
    def _take(self, message: Call | Cancel | Release | Hello | Listening) -> None:
        if isinstance(message, Call):
            calls = self.channel.calls
            calls[self.index] = calls.get(self.index, 0) + 1
            task = self.loop.create_task(self._infer(message))
            self.tasks[message.id] = task
        elif isinstance(message, Cancel):
            running = self.tasks.get(message.id)
            if running is not None:
                running.cancel()
                running.add_done_callback(functools.partial(self._unanswered, message.id))
        elif isinstance(message, Listening):
            self.listening = True
            self.channel.changed.set()
        elif isinstance(message, Release):
            if self.outputs is not None:
                for block in message.blocks:
                    self.outputs.free(tuple(block))  # type: ignore[arg-type]
        else:
            self.pid = message.pid
            self.index = message.index
            self.inputs, self.outputs = self.channel.arenas.get(message.index, (None, None))
            self._send(Welcome())

    def _unanswered(self, ident: int, task: asyncio.Task[None]) -> None:
        """A call cancelled before its task ran (its Cancel came in the same read) never reached ``_infer``'s
        answer: answer it here, or the worker would keep its input blocks for a reply that never comes."""
        if task.cancelled():
            self.tasks.pop(ident, None)
            self._send(error_reply(ident, Cancelled("the request was cancelled")))

    def _trace(self, call: Call) -> Any:
        tracing = self.channel.dataplane.tracing
        if tracing is None or call.trace_headers is None:
            return None
        trace = tracing.start(call.model, call.version, call.trace_headers)
        if trace is not None:
            trace.request(call.request_id)
        return trace

    async def _infer(self, call: Call) -> None:
        trace = None
        try:
            request = request_of(call, self.inputs)
            trace = self._trace(call)
            dataplane = self.channel.dataplane
            response = await dataplane.infer(call.model, call.version, request, trace, endpoint=call.endpoint)
        except asyncio.CancelledError as exc:
            _end(trace, call.endpoint, exc)
            self._send(error_reply(call.id, Cancelled("the request was cancelled")))
            return
        except Exception as exc:
            _end(trace, call.endpoint, exc)
            if not isinstance(exc, ModelsvcError):
                logger.error("inference on model %s failed", call.model, exc_info=exc)
            self._send(error_reply(call.id, exc))
            return
        finally:
            self.tasks.pop(call.id, None)
        blocks: list[tuple[int, int]] = []
        try:
            self._send(reply_for(call.id, response, True, self.outputs, blocks))
        except Exception as exc:  # outputs the wire cannot carry: the call fails, its blocks go back
            for block in blocks:
                cast(OwnedArena, self.outputs).free(block)
            if not isinstance(exc, ModelsvcError):
                logger.error("the response of model %s cannot be sent to its worker", call.model, exc_info=exc)
            _end(trace, call.endpoint, exc)
            self._send(error_reply(call.id, exc))
            return
        _end(trace, call.endpoint, None)


GRPC_ENDPOINT = "ModelInfer RPC"
"""The ``endpoint`` of a call from a worker's gRPC door (``InferenceService.ModelInfer``)."""


def _end(trace: Any, endpoint: str | None, error: BaseException | None) -> None:
    """Close a call's span as its door closes it in one process: a gRPC call's with rpc.system and its code."""
    if trace is None:
        return
    if endpoint == GRPC_ENDPOINT:
        code = grpc.StatusCode.OK if error is None else grpc.StatusCode.CANCELLED
        _end_trace(trace, error, _code(error) if isinstance(error, Exception) else code)
    elif error is None:
        trace.end(200, None)
    elif isinstance(error, DecoupledRefused):
        trace.end(DecoupledRefused.http_status, error)  # the HTTP door's 501
    else:
        trace.end(http_error(error)[0] if isinstance(error, Exception) else 499, error)
