"""A caller's deadline, carried by every call made under it.

    with deadline(1.5):                       # this request's caller waits 1.5 s at most
        await model.infer(...)                # each call (retries included) ends by then

Inside the block every call's timeout is cut to the time left, a call made after the deadline fails at once
with ``Timeout`` (nothing is sent), and inference requests carry the time left as Triton's ``timeout``
request parameter (microseconds). A model whose queue policy allows it (``allow_timeout_override: true``, or
no ``dynamic_batching``) then drops the request from its queue once the caller has stopped waiting, instead of
computing an answer nobody reads; gRPC calls also carry it as their own deadline (``grpc-timeout``).

The deadline lives in a context variable: it follows the asyncio task (and the tasks it creates) or the
thread that set it, so one logic server can serve many requests, each under its own deadline. Nested blocks
keep the earlier of the two.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ._errors import Timeout

__all__ = ["current_deadline", "deadline"]

_DEADLINE: ContextVar[float | None] = ContextVar("modelsvc_client_deadline", default=None)
TIMEOUT_PARAMETER = "timeout"
"""Triton's request parameter for a request's queue timeout, in microseconds."""


@contextmanager
def deadline(seconds: float | None = None, *, at: float | None = None) -> Iterator[float | None]:
    """Calls made inside end within ``seconds`` from now (or by ``at``, a ``time.monotonic()`` value).

    ``None`` for both leaves the current deadline as it is. Yields the deadline in force (monotonic)."""
    if seconds is not None and at is not None:
        raise ValueError("give seconds or at, not both")
    if seconds is not None:
        at = time.monotonic() + seconds
    outer = _DEADLINE.get()
    if at is None or (outer is not None and outer <= at):
        yield outer
        return
    token = _DEADLINE.set(at)
    try:
        yield at
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    """The deadline in force here (``time.monotonic()`` seconds), or None."""
    return _DEADLINE.get()


def call_timeout(timeout: float | None) -> float | None:
    """A call's timeout cut to the deadline in force; raises ``Timeout`` once the deadline has passed."""
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise Timeout("the caller's deadline has passed; the call was not sent")
    return left if timeout is None else min(timeout, left)


def with_timeout_parameter(parameters: Mapping[str, Any] | None, left: float | None) -> Mapping[str, Any] | None:
    """The request's parameters with Triton's ``timeout`` set to ``left`` seconds (as microseconds), when a
    deadline is in force and the caller did not set one itself."""
    if left is None or _DEADLINE.get() is None or (parameters and TIMEOUT_PARAMETER in parameters):
        return parameters
    return {**(parameters or {}), TIMEOUT_PARAMETER: max(1, int(left * 1e6))}
