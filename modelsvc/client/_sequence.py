"""Sequences for stateful models (Triton's sequence batcher): the requests of one sequence, start to end.

    async with client.sequence("accumulate") as seq:        # sequence_id generated (or give sequence_id=)
        await seq.infer(INPUT=[[1]])                         # carries sequence_start
        await seq.infer(INPUT=[[2]])
        last = await seq.infer(INPUT=[[3]], end=True)        # carries sequence_end

Every request carries Triton's request parameters exactly as tritonclient sends them: ``sequence_id`` (an int,
or a str for a model whose CORRID is TYPE_STRING), ``sequence_start`` and ``sequence_end`` (bools), all three on
every request (HTTP JSON ``parameters``; gRPC ``InferParameter`` int64_param / string_param and bool_param).

Leaving the block ends the sequence on the server. When no request carried ``end=True`` (an exception in the
block, or the caller never said which call was the last), the last inputs are sent once more with
``sequence_end`` and that answer is discarded: the protocol has no request that ends a sequence without inputs.
If even that fails, the server releases the sequence after its ``max_sequence_idle_microseconds``.

Over HTTP a client (an ``AsyncClient``, or a ``Client`` shared by threads) lets at most half its connections
(``max_connections``) carry sequence starts at once. A start waits on the server until a sequence slot frees;
were every connection taken by such waiting starts, the next request of a sequence that holds a slot could not
be sent, and the server would release that sequence when its idle time ran out (seen: 64 sequences over 32
connections on a model with 2 slots). gRPC multiplexes its calls on one connection and needs no such bound.

Over several replicas (``AsyncClient([...])``) every request of a sequence goes to the replica that took its
first one; a replica lost mid-sequence raises ``SequenceLost`` (the model's state for the sequence is gone with
it), never a silent restart elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from ..protocol import Tensor
from ._core import InferResult, to_tensor
from ._errors import ClientError, ConnectionLost

__all__ = [
    "SEQUENCE_END",
    "SEQUENCE_ID",
    "SEQUENCE_START",
    "AsyncInferSequence",
    "InferSequence",
    "SequenceLost",
    "new_sequence_id",
    "sequence_key",
    "sequence_parameters",
]

logger = logging.getLogger("modelsvc.client")

SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"

_ID_SPACE = 2**31 - 1
"""Generated ids fit every integer CORRID type (INT32, UINT32, INT64, UINT64)."""
_ids = itertools.count(random.randrange(1, _ID_SPACE))
_ids_lock = threading.Lock()


def _reseed() -> None:
    """A forked worker starts its ids elsewhere too (it would repeat its parent's otherwise)."""
    global _ids, _ids_lock
    _ids = itertools.count(random.SystemRandom().randrange(1, _ID_SPACE))
    _ids_lock = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_reseed)


class SequenceLost(ConnectionLost):
    """The replica that holds a sequence's state is gone (or failed mid-sequence): start the sequence again."""


def new_sequence_id() -> int:
    """A correlation id for a new sequence: consecutive from a random start, so this process never reuses one
    while fewer than 2**31 - 1 sequences were made, and other processes (forked ones too) start elsewhere.
    Never 0 (Triton's "no sequence")."""
    with _ids_lock:
        return next(_ids) % _ID_SPACE + 1


def check_sequence_id(sequence_id: int | str) -> int | str:
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
        raise TypeError(f"sequence_id must be an int or a str, got {type(sequence_id).__name__}")
    if sequence_id == 0 or sequence_id == "":
        raise ValueError("sequence_id 0 and '' mean 'no sequence' in Triton: give another id")
    if isinstance(sequence_id, int) and not -(2**63) <= sequence_id < 2**64:
        raise ValueError(f"sequence_id {sequence_id} does not fit in 64 bits")
    return sequence_id


def sequence_parameters(
    sequence_id: int | str, start: bool, end: bool, parameters: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``parameters`` with the three sequence parameters tritonclient sends (all three, every request)."""
    return {**(parameters or {}), SEQUENCE_ID: sequence_id, SEQUENCE_START: bool(start), SEQUENCE_END: bool(end)}


def sequence_key(parameters: Mapping[str, Any] | None) -> int | str | None:
    """The sequence a request belongs to (its ``sequence_id`` parameter), None when it belongs to none."""
    if not parameters:
        return None
    value = parameters.get(SEQUENCE_ID)
    if value is None or isinstance(value, bool) or value == 0 or value == "":
        return None
    return value if isinstance(value, int | str) else None


class _SyncInfer(Protocol):
    _sequence_starts: threading.Semaphore | None
    """Bounds the sequence starts in flight across threads (HTTP: half the connections), or None."""

    def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult: ...


class _AsyncInfer(Protocol):
    _sequence_starts: asyncio.Semaphore | None
    """Bounds the sequence starts in flight (HTTP: half the connections), or None."""

    async def _infer(
        self,
        model: str,
        version: str | None,
        tensors: Sequence[Tensor],
        outputs: Sequence[str] | None,
        request_id: str | None,
        parameters: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> InferResult: ...


class _State:
    """What both sequence kinds share: the id, where the sequence is, the last inputs (to end it with)."""

    def __init__(self, model: str, sequence_id: int | str | None, version: str | None) -> None:
        self.model = model
        self.version = version
        self.id: int | str = new_sequence_id() if sequence_id is None else check_sequence_id(sequence_id)
        self.started = False
        """A request of this sequence reached the server (its first carried sequence_start)."""
        self.ended = False
        """A request with sequence_end was sent (answered or not): no more requests."""
        self.steps = 0
        self._last: list[Tensor] | None = None

    def _request(
        self,
        inputs: Mapping[str, Any] | None,
        named: Mapping[str, Any],
        end: bool,
        parameters: Mapping[str, Any] | None,
    ) -> tuple[list[Tensor], dict[str, Any]]:
        if self.ended:
            raise ClientError(f"sequence {self.id!r} of model '{self.model}' has ended: start a new one")
        values = {**(inputs or {}), **named}
        if not values:
            raise ClientError(f"sequence {self.id!r}: a request needs inputs")
        tensors = [to_tensor(name, value) for name, value in values.items()]
        return tensors, sequence_parameters(self.id, not self.started, end, parameters)

    def _sent(self, tensors: list[Tensor], params: Mapping[str, Any], ok: bool) -> None:
        """After a request went out: a start that failed may be sent again as a start; an end ends it."""
        if ok or not params[SEQUENCE_START]:
            self.started = True
        if params[SEQUENCE_END]:
            self.ended = True
        if ok:
            self.steps += 1
            self._last = tensors

    def _closing(self) -> list[Tensor] | None:
        """The inputs to end the sequence with on leaving the block, None when nothing is to be sent."""
        if self.ended or not self.started or self._last is None:
            self.ended = True
            return None
        return self._last

    def __repr__(self) -> str:
        where = "ended" if self.ended else "live" if self.started else "not started"
        return f"<sequence {self.id!r} of model '{self.model}': {where}, {self.steps} steps>"


class InferSequence(_State):
    """``client.sequence("model")``: the requests of one sequence through a ``Client`` (see the module)."""

    def __init__(self, client: _SyncInfer, model: str, sequence_id: int | str | None, version: str | None) -> None:
        super().__init__(model, sequence_id, version)
        self._client = client

    def infer(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> InferResult:
        """The next request of the sequence (the first carries sequence_start; ``end=True`` makes it the last)."""
        tensors, params = self._request(inputs, named, end, parameters)
        gate = None if self.started else self._client._sequence_starts
        try:
            with gate or contextlib.nullcontext():
                result = self._client._infer(self.model, self.version, tensors, outputs, request_id, params, timeout)
        except BaseException:
            self._sent(tensors, params, ok=False)
            raise
        self._sent(tensors, params, ok=True)
        return result

    def end(self, inputs: Mapping[str, Any] | None = None, /, **named: Any) -> InferResult | None:
        """End the sequence: with these inputs as its last request, or (none given) its last inputs again, whose
        answer is returned. None when there is nothing to end."""
        if inputs or named:
            return self.infer(inputs, end=True, **named)
        last = self._closing()
        if last is None:
            return None
        params = sequence_parameters(self.id, False, True)
        self.ended = True
        return self._client._infer(self.model, self.version, last, None, None, params, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.end()
        except ClientError as error:
            if exc is None:
                raise
            logger.warning("could not end sequence %r of model '%s' after an error: %s", self.id, self.model, error)


class AsyncInferSequence(_State):
    """``client.sequence("model")`` on an ``AsyncClient``: ``async with``, and the same methods awaited."""

    def __init__(self, client: _AsyncInfer, model: str, sequence_id: int | str | None, version: str | None) -> None:
        super().__init__(model, sequence_id, version)
        self._client = client

    async def infer(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **named: Any,
    ) -> InferResult:
        tensors, params = self._request(inputs, named, end, parameters)
        gate = None if self.started else self._client._sequence_starts
        try:
            async with gate or contextlib.nullcontext():
                result = await self._client._infer(
                    self.model, self.version, tensors, outputs, request_id, params, timeout
                )
        except BaseException:
            self._sent(tensors, params, ok=False)
            raise
        self._sent(tensors, params, ok=True)
        return result

    async def end(self, inputs: Mapping[str, Any] | None = None, /, **named: Any) -> InferResult | None:
        if inputs or named:
            return await self.infer(inputs, end=True, **named)
        last = self._closing()
        if last is None:
            return None
        params = sequence_parameters(self.id, False, True)
        self.ended = True
        return await self._client._infer(self.model, self.version, last, None, None, params, None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.end()
        except ClientError as error:
            if exc is None:
                raise
            logger.warning("could not end sequence %r of model '%s' after an error: %s", self.id, self.model, error)
