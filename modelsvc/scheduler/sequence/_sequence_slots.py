"""The sequence batcher's bookkeeping: a request of a sequence (``Step``), a sequence (``SequenceEntry``: its
queued requests, its slot, its implicit state, its idle timer) and an instance with its slots (``Lane``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ...protocol import InferRequest
from .._instances import Arrays, InstanceThread
from .._tracing import TracedRequest
from ._sequence_rows import CorrId


@dataclass(eq=False, slots=True)
class Step:
    """One request of a sequence."""

    inputs: Arrays
    outputs: tuple[str, ...]
    request: InferRequest | None
    future: asyncio.Future[Arrays]
    start: bool
    end: bool
    enqueued_ns: int
    key: Hashable
    on_start: Callable[[int], None] | None = None
    trace: TracedRequest | None = None


@dataclass(eq=False, slots=True)
class SequenceEntry:
    corrid: CorrId
    value: Any
    """The correlation id as the CORRID control holds it."""
    steps: deque[Step] = field(default_factory=deque)
    running: bool = False
    lane: Lane | None = None
    slot: int = -1
    state: Arrays | None = None
    last_ns: int = 0
    idle: asyncio.TimerHandle | None = None
    live: bool = True
    """Takes further requests (no END yet, not released)."""


@dataclass(eq=False, slots=True)
class Lane:
    """One instance: its thread, its sequence slots and whether a batch runs on it."""

    index: int
    worker: InstanceThread
    slots: list[SequenceEntry | None]
    busy: bool = False
    timer: asyncio.TimerHandle | None = None
