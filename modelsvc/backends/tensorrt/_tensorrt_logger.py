"""The process's one TensorRT logger, shared by the runtime (``_tensorrt_engine``) and the builder
(``modelsvc.tools.trt._builder``).

TensorRT keeps a single logger per process: a ``trt.Runtime``, ``trt.Builder`` or ``trt.OnnxParser`` made while
another lives keeps logging through the first logger it was given ("TensorRT maintains only a single logger
pointer at any given time"). With a logger per engine, every engine after the first lost TensorRT's error text,
and freeing the first engine left TensorRT calling a freed Python object. So there is one logger, made on first
use and never freed, and whoever wants TensorRT's own words for one call captures them:

- :func:`shared_logger` is the logger to hand to every ``Runtime``/``Builder``/``OnnxParser``;
- ``with capture() as log:`` collects what TensorRT logs during the block into ``log.errors`` and
  ``log.warnings``. A message goes to the open captures of the thread that logs it (TensorRT logs on the calling
  thread), or, logged on a thread with none (TensorRT's own workers), to every open capture;
- :func:`scoped` runs a function inside a capture and :func:`collect` points that capture at the caller's own
  lists: the builder's way, which keeps its ``errors``/``warnings`` lists.

A message is also written to Python logging (``modelsvc.backends.tensorrt``: errors as errors, warnings as
warnings, the rest as debug) unless every capture that took it was opened with ``forward=False``; a message that
no capture takes is always written there.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

__all__ = ["Capture", "capture", "collect", "scoped", "shared_logger"]

logger = logging.getLogger("modelsvc.backends.tensorrt")

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(eq=False)
class Capture:
    """What TensorRT logged while a capture was open."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: also write the captured messages to Python logging
    forward: bool = True
    thread: int = field(default_factory=threading.get_ident)


_lock = threading.Lock()
_open: list[Capture] = []
#: the one logger, once made; a test that swaps in another ``tensorrt`` module gets another one
_logger: Any = None


def shared_logger(trt: Any) -> Any:
    """The process's TensorRT logger (a ``trt.ILogger``), made on first use and kept for the process's life."""
    global _logger
    with _lock:
        if _logger is None or not isinstance(_logger, trt.ILogger):
            _logger = _make(trt)
        return _logger


def _make(trt: Any) -> Any:
    severity = trt.ILogger.Severity
    errors = (severity.INTERNAL_ERROR, severity.ERROR)

    class _ProcessLogger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, level: Any, msg: str) -> None:
            kind = "error" if level in errors else "warning" if level == severity.WARNING else "debug"
            _record(kind, str(msg))

    return _ProcessLogger()


def _record(kind: str, message: str) -> None:
    with _lock:
        here = threading.get_ident()
        takers = [c for c in _open if c.thread == here] or list(_open)
        for taker in takers:
            if kind == "error":
                taker.errors.append(message)
            elif kind == "warning":
                taker.warnings.append(message)
        forward = not takers or any(c.forward for c in takers)
    if forward:
        level = {"error": logging.ERROR, "warning": logging.WARNING}.get(kind, logging.DEBUG)
        logger.log(level, "TensorRT: %s", message)


@contextmanager
def capture(*, forward: bool = True) -> Iterator[Capture]:
    """Collect what TensorRT logs during the block (see the module docstring)."""
    taken = Capture(forward=forward)
    with _lock:
        _open.append(taken)
    try:
        yield taken
    finally:
        with _lock:
            _open.remove(taken)


_scopes = threading.local()


def scoped(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` run inside a capture (``forward=False``) that :func:`collect` can point at its own lists."""

    @functools.wraps(function)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with capture(forward=False) as taken:
            stack: list[Capture] = vars(_scopes).setdefault("stack", [])
            stack.append(taken)
            try:
                return function(*args, **kwargs)
            finally:
                stack.pop()

    return run


def collect(trt: Any, errors: list[str], warnings: list[str]) -> Any:
    """Point the capture of the innermost :func:`scoped` call on this thread at ``errors`` and ``warnings`` (what
    it collected so far moves there too); the shared logger."""
    stack: list[Capture] = vars(_scopes).get("stack", [])
    if not stack:
        raise RuntimeError("_tensorrt_logger.collect is called outside a function wrapped with @scoped")
    taken = stack[-1]
    with _lock:
        errors.extend(taken.errors)
        warnings.extend(taken.warnings)
        taken.errors, taken.warnings = errors, warnings
    return shared_logger(trt)
