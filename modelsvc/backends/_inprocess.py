"""The data plane as code running inside the server sees it: how python models call other models (BLS).

A python model's ``execute`` runs on its instance's worker thread. When it calls
``pb_utils.InferenceRequest(...).exec()``, the request goes to the same ``DataPlane.infer`` that HTTP and
gRPC requests go to, so it passes the target model's checks, scheduler, dynamic batcher and statistics,
with no network hop and no serialization: the numpy arrays themselves travel. ``DataPlane.infer`` lives
on the server's event loop, so the worker thread submits the coroutine to that loop and waits for it.
What BLS needs of the data plane is ``modelsvc.protocol.InProcessTarget``; the client's in-process binding
(``modelsvc.client.InProcessTransport``, embedded mode) reaches the same data plane through ``InProcessService``.

``DataPlane.__init__`` binds itself here together with the loop it was created on. The binding is
process-wide (a process runs one server) and weak: once that data plane is gone, ``current()`` answers
None, as it does when the loop is closed. A later data plane replaces an earlier one.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass

from modelsvc.protocol import InProcessTarget


@dataclass(frozen=True, slots=True)
class Binding:
    """The bound data plane and the event loop its coroutines must run on."""

    target: InProcessTarget
    loop: asyncio.AbstractEventLoop


_lock = threading.Lock()
_bound: tuple[weakref.ref[InProcessTarget], asyncio.AbstractEventLoop] | None = None


def bind(target: InProcessTarget, loop: asyncio.AbstractEventLoop) -> None:
    """Make ``target`` (running on ``loop``) the data plane that BLS requests of this process go to."""
    global _bound
    with _lock:
        _bound = (weakref.ref(target), loop)


def unbind(target: InProcessTarget) -> None:
    """Forget ``target`` if it is the bound data plane (a later binding is left alone)."""
    global _bound
    with _lock:
        if _bound is not None and _bound[0]() is target:
            _bound = None


def current() -> Binding | None:
    """The bound data plane, or None when there is none (no server in this process, or it has stopped)."""
    bound = _bound
    if bound is None:
        return None
    target = bound[0]()
    if target is None or bound[1].is_closed():
        return None
    return Binding(target, bound[1])
