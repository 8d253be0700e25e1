"""The sequence batcher's bookkeeping: a request of a sequence (``Step``: the job and its flags), a sequence
(``SequenceEntry``: its queued requests, its slot, its implicit state, its idle timer) and an instance with its
slots (``Lane``)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._instances import Arrays, InstanceThread
from .._job import WorkItem
from ._sequence_rows import CorrId


@dataclass(eq=False, slots=True)
class Step:
    """One request of a sequence: the data plane's job (its future, arrival time and shape key filled in) and
    whether it starts or ends its sequence."""

    job: WorkItem
    start: bool
    end: bool


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
