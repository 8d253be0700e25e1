"""The worker's end of the ingest channel: ``RemoteDataPlane``, what the doors call for inference in a worker.

The doors (the HTTP fast path, gRPC ``ModelInfer``) decode a request, validate its framing and call ``infer`` as they
call the engine's data plane in one process; here ``infer`` sends the request to the engine and awaits its reply.
A caller that goes away (its connection closed, its gRPC deadline passed) cancels its call: the engine withdraws it
when it is still queued. Input blocks in the worker's arena are freed when the engine's final reply for them comes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from typing import Any, cast

from ...protocol import InferRequest, InferResponse, Unavailable
from ._arena import ArenaView, OwnedArena
from ._wire import (
    Cancel,
    FrameReader,
    Hello,
    Outbox,
    Release,
    Reply,
    Welcome,
    call_for,
    decode_to_worker,
    error_of,
    response_of,
)

ENGINE_GONE = "the model service's engine process is gone"


class _Pending:
    __slots__ = ("blocks", "waiter")

    def __init__(self, waiter: asyncio.Future[Reply] | None, blocks: list[tuple[int, int]]) -> None:
        self.waiter = waiter
        self.blocks = blocks


class EngineLink(asyncio.Protocol):
    """This worker's connection to the engine."""

    def __init__(self, arena: OwnedArena, engine_arena: ArenaView, index: int) -> None:
        self.index = index
        self.loop = asyncio.get_running_loop()
        self.arena = arena
        self.engine_arena = engine_arena
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count(1)
        self.welcomed: asyncio.Future[None] = self.loop.create_future()
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self._release: list[tuple[int, int]] = []
        self.outbox = Outbox(self.loop, self._released)

    @classmethod
    async def connect(cls, path: str, arena: OwnedArena, engine_arena: ArenaView, index: int) -> EngineLink:
        loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(lambda: cls(arena, engine_arena, index), path)
        link.send(Hello(os.getpid(), index))
        await link.welcomed
        return link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.outbox.transport = self.transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = self.outbox.transport = None
        for pending in self.pending.values():
            if pending.waiter is not None and not pending.waiter.done():
                pending.waiter.set_exception(Unavailable(ENGINE_GONE))
        self.pending.clear()
        if not self.welcomed.done():
            self.welcomed.set_exception(ConnectionError(ENGINE_GONE))
        if not self.lost.done():
            self.lost.set_result(None)

    def send(self, message: Any) -> None:
        self.outbox.send(message)

    def _released(self) -> list[Release]:
        """The blocks of the engine's arena released this turn, as one message."""
        if not self._release:
            return []
        released, self._release = Release(self._release), []
        return [released]

    def data_received(self, data: bytes) -> None:
        for body in self.reader.feed(data):
            message = decode_to_worker(body)
            if isinstance(message, Welcome):
                self.welcomed.set_result(None)
                continue
            pending = self.pending.get(message.id)
            if pending is not None and message.final:
                del self.pending[message.id]
                for block in pending.blocks:
                    self.arena.free(block)
            if pending is not None and pending.waiter is not None and not pending.waiter.done():
                pending.waiter.set_result(message)
            else:  # its caller went away: nobody reads its outputs, so the engine may have their blocks back
                self._release_blocks(message)

    def _release_blocks(self, reply: Reply) -> None:
        blocks = [t.block for t in reply.outputs or () if t.block is not None]
        if blocks:
            self._release.extend(blocks)
            self.outbox.wake()

    def take_response(self, reply: Reply) -> InferResponse:
        """The reply's response, its arena blocks copied out and released to the engine."""
        response = response_of(reply, self.engine_arena)
        if any(t.block is not None for t in reply.outputs or ()):
            for tensor in response.outputs:  # the arrays view the engine's arena: own them before the release
                tensor.data = tensor.data.copy()
            self._release_blocks(reply)
        return response


class ForwardedTrace:
    """A worker's stand-in for a trace: it carries the request's W3C context to the engine, which traces it."""

    __slots__ = ("headers",)

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = headers

    def request(self, request_id: str | None) -> None:
        pass

    def set_attribute(self, key: str, value: str | int) -> None:
        pass

    def enqueued(self, version: str) -> None:
        pass

    def end(self, status: int, error: BaseException | None) -> None:
        pass


class ForwardTracing:
    """Set as the worker's ``tracing`` when the engine traces: every request's context goes with it (the headers of
    the propagators the engine extracts with: OTEL_PROPAGATORS, W3C's by default, inherited from the engine)."""

    def __init__(self) -> None:
        from opentelemetry import propagate

        self.names = frozenset(name.lower().encode("latin-1") for name in propagate.get_global_textmap().fields)

    def start(self, model: str, version: str | None, headers: Sequence[tuple[bytes, bytes]]) -> ForwardedTrace:
        names = self.names
        return ForwardedTrace([(k, v) for k, v in headers if k in names])

    def shutdown(self) -> None:
        pass


class RemoteDataPlane:
    """The data plane as a worker's doors see it: inference goes to the engine."""

    def __init__(self, link: EngineLink, tracing: ForwardTracing | None) -> None:
        self.link = link
        self.tracing = tracing

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: Any = None,
        *,
        endpoint: str | None = None,
    ) -> InferResponse:
        link = self.link
        if link.transport is None:
            raise Unavailable(ENGINE_GONE)
        ident = next(link.ids)
        blocks: list[tuple[int, int]] = []
        headers = trace.headers if isinstance(trace, ForwardedTrace) else None
        try:
            call = call_for(
                ident, name, version, request,
                endpoint=endpoint, trace_headers=headers, arena=link.arena, blocks=blocks,
            )  # fmt: skip
            link.send(call)
        except BaseException:  # never sent (a tensor it cannot pack, a frame over the limit): its blocks go back
            for block in blocks:
                link.arena.free(block)
            raise
        waiter: asyncio.Future[Reply] = link.loop.create_future()
        link.pending[ident] = _Pending(waiter, blocks)
        try:
            reply = await waiter
        except asyncio.CancelledError:
            if ident in link.pending:
                link.pending[ident].waiter = None  # its blocks are freed when the engine's final reply comes
                link.send(Cancel(ident))
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                link._release_blocks(waiter.result())  # its reply came as its caller left: nobody reads it
            raise
        if reply.error is not None:
            raise error_of(reply.error)
        return link.take_response(reply)
