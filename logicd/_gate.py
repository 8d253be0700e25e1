"""One route's gate: how many of its requests run at once, and which may wait for a slot, by their expected wait.

A request that finds a free slot (``in_flight`` below the limit, nobody waiting) goes in. Otherwise it may wait
for one, first come, first served, when what is ahead of it lets it start within its budget: the caller's deadline
(less the request's own expected time) or, without one, ``max_wait_s`` from service.yaml. What is ahead is measured
in learnt cost, not counted: the bytes of request body in flight that the pair has not yet worked off, plus those
of every waiter, at the pace the pair drains this route (seconds of busy time per byte of body, learnt from the
requests it answered); a request weighs at least one row's worth of bytes (the route's mean body over its mean
rows, from ``Context.infer_chunks``), since the shortest text still costs a model call. So a burst of short
documents waits where the same number of long ones would not fit.

Bursts and storms. A burst whose expected wait fits the budget waits its turn. Demand the budget cannot hold
marks the route *overloaded*: a request refused against ``max_wait_s`` (not one refused against its own
deadline: a caller's deadline says nothing of the load), or a queue that has not drained to one request's wait for
longer than ``max_wait_s`` (a burst admitted within the budget drains within it, so a queue that stands longer is
fed as fast as it drains: callers with long deadlines, or as many closed-loop callers as the budget holds). From
then on a newcomer may wait only as long as one typical request of the route takes (its target), even for a free
slot.
When ``max_wait_s`` overflowed, the waiters beyond that target are refused at once too: they came in the same
wave, so they have waited only for the wave to arrive. The route stays overloaded until ``2 x retry_after_s`` (at
least 2 s) pass with no such refusal. So the requests a storm lets in keep about the latency they have under
light load, and the rest are refused with Retry-After.

Before the route has a learnt pace (its first answers), waiting is bounded by count: twice the in-flight limit.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ._config import AdmissionConfig

__all__ = ["RouteGate"]

#: weight of the past in the learnt pace: about the last five answers count
_DECAY = 0.8
#: a route stays overloaded this many Retry-After periods after its last refusal for want of room
_HOLD_PERIODS = 2.0
_MIN_HOLD_S = 2.0


class Capacity(Protocol):
    """What the gate reads of the model's capacity (``logicd._admission.Capacity``)."""

    @property
    def queue_timeout_s(self) -> float | None: ...

    def rows(self, tokens_per_row: float) -> float: ...


class _Cost:
    """What a route's requests send to the models (rows and tokens, moving averages), for the in-flight limit;
    and the pace at which the pair works off their bodies, for the expected wait."""

    def __init__(self, rows: float, tokens_per_row: float) -> None:
        self.rows = rows
        self.tokens_per_row = tokens_per_row
        self._busy = 0.0
        self._bytes = 0.0
        self.mean_bytes: float | None = None
        """A request body's size, moving average over the answered requests."""
        self.mean_weight: float | None = None
        """A request's weight (``RouteGate.weigh``), moving average over the answered requests."""

    def observe(self, rows: int, tokens: int) -> None:
        if rows <= 0:
            return  # a request that made no counted model call says nothing about the cost
        self.rows += 0.2 * (rows - self.rows)
        self.tokens_per_row += 0.2 * (tokens / rows - self.tokens_per_row)

    def drained(self, size: float, weight: float, busy_s: float) -> None:
        """A request of ``size`` bytes of body (``weight``) was answered; the route had requests in flight for
        ``busy_s`` since the last answer."""
        self._busy = _DECAY * self._busy + busy_s
        self._bytes = _DECAY * self._bytes + weight
        self.mean_bytes = size if self.mean_bytes is None else self.mean_bytes + 0.2 * (size - self.mean_bytes)
        w = self.mean_weight
        self.mean_weight = weight if w is None else w + 0.2 * (weight - w)

    @property
    def bytes_per_row(self) -> float:
        """Bytes of body per row (window) the route's requests send to the models, or per request where they
        make no counted model call: the least a request weighs, since each costs at least one model call."""
        return (self.mean_bytes or 1.0) / max(self.rows, 1.0)

    @property
    def seconds_per_byte(self) -> float | None:
        """The learnt pace; None before the first answer."""
        return self._busy / self._bytes if self._bytes > 0 and self._busy > 0 else None


@dataclass
class _Waiter:
    size: float
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """True: a slot is granted; False: refused while waiting (the route turned overloaded)."""


class RouteGate:
    """A route's slots: ``in_flight`` requests admitted, ``waiting`` ones queued for a slot (FIFO)."""

    def __init__(
        self,
        route: str,
        config: AdmissionConfig,
        capacity: Callable[[], Capacity | None],
        window: int,
        default_wait_s: float,
    ) -> None:
        self.route = route
        self.config = config
        self._capacity = capacity
        self._default_wait_s = default_wait_s
        self.cost = _Cost(rows=1.0, tokens_per_row=float(window))
        self.in_flight = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._in_flight_bytes = 0.0
        self._backlog = 0.0
        """Bytes of the bodies in flight the pair has not yet worked off (a fluid estimate at the learnt pace)."""
        self._waiting_bytes = 0.0
        self._clock = time.monotonic()
        self._busy_since_answer = 0.0
        self.overloaded_until = -math.inf
        self._calm_at = time.monotonic()
        """When a newcomer last found no more than the target ahead of it (a queue that drained)."""

    # -- what the gate allows -------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def limit(self) -> int:
        if self.config.max_in_flight != "auto":
            return self.config.max_in_flight
        capacity = self._capacity()
        if capacity is None:  # the models are not known yet: one at a time until they are
            return 1
        return max(1, math.ceil(capacity.rows(self.cost.tokens_per_row) / max(self.cost.rows, 1.0) - 0.25))

    @property
    def max_wait_s(self) -> float:
        """The budget of a request without a deadline: ``max_wait_s``; ``auto``, the model's queue timeout, else
        the model call timeout (``model_service.timeout_s``): a longer wait would only end in a timeout."""
        if self.config.max_wait_s != "auto":
            return self.config.max_wait_s
        capacity = self._capacity()
        timeout = capacity.queue_timeout_s if capacity is not None else None
        return timeout if timeout is not None else self._default_wait_s

    @property
    def overloaded(self) -> bool:
        return time.monotonic() < self.overloaded_until

    def expected_wait_s(self) -> float | None:
        """How long a newcomer would wait for the pair to work off what is ahead of it; None before a pace is
        learnt."""
        pace = self.cost.seconds_per_byte
        if pace is None:
            return None
        self._tick(time.monotonic())
        return pace * (self._backlog + self._waiting_bytes)

    def target_s(self) -> float:
        """The wait a newcomer may have while the route is overloaded: what one typical request takes."""
        pace = self.cost.seconds_per_byte
        return 0.0 if pace is None or self.cost.mean_weight is None else pace * self.cost.mean_weight

    # -- taking and giving back slots -------------------------------------------------------------------------

    async def acquire(self, deadline: float | None, size: float | None = None) -> str | None:
        """Take a slot for a request of ``size`` bytes of body; None when taken, else why not: ``full`` or
        ``waited`` (503), ``late`` (503: the expected wait passes the deadline), ``deadline`` (504: it passed while
        waiting)."""
        body = size
        size = self.weigh(size)
        now = time.monotonic()
        if self.in_flight < self.limit and not self._waiters:
            if (self.expected_wait_s() or 0.0) <= self.target_s():
                self._calm_at = now
            elif now < self.overloaded_until:
                self._overload(now)  # a free slot, but what is in flight is more than a storm may queue
                return "full"
            self._start(size, now)
            return None
        why = self._room(deadline, size, now)
        if why is not None:
            return why
        waiter = _Waiter(size)
        self._waiters.append(waiter)
        self._waiting_bytes += size
        wait = self.max_wait_s if deadline is None else deadline - now
        try:
            granted = await asyncio.wait_for(asyncio.shield(waiter.future), wait)
        except TimeoutError:
            if waiter.future.done() and waiter.future.result():  # granted as the wait ran out: the slot is ours
                return None
            waiter.future.cancel()
            return "deadline" if deadline is not None and time.monotonic() >= deadline else "waited"
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.result():
                self.release(body)  # granted, but nobody is left to use it
            waiter.future.cancel()
            raise
        finally:
            self._forget(waiter)
        return None if granted else "full"

    def release(self, size: float | None = None) -> None:
        """A request of ``size`` bytes is done: its slot goes to the oldest waiter, or back to the pool."""
        weight = self.weigh(size)
        now = time.monotonic()
        self._tick(now)
        self.cost.drained(size if size is not None and size > 0 else weight, weight, self._busy_since_answer)
        self._busy_since_answer = 0.0
        self.in_flight -= 1
        self._in_flight_bytes = max(0.0, self._in_flight_bytes - weight) if self.in_flight else 0.0
        self._backlog = min(self._backlog, self._in_flight_bytes)
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            self._waiting_bytes = max(0.0, self._waiting_bytes - waiter.size)
            if not waiter.future.done():
                self._start(waiter.size, now)
                waiter.future.set_result(True)

    # -- inside ---------------------------------------------------------------------------------------------

    def weigh(self, size: float | None) -> float:
        """What a request of ``size`` bytes of body weighs, in bytes: its size, but at least one row's worth (a
        document of five words costs a model call as a window of 500 tokens does); the mean without a size."""
        raw = float(size) if size is not None and size > 0 else (self.cost.mean_bytes or 1.0)
        return max(raw, self.cost.bytes_per_row)

    def _tick(self, now: float) -> None:
        """Advance the clock: the pair works off the backlog at the learnt pace while anything is in flight."""
        if self.in_flight > 0:
            elapsed = now - self._clock
            self._busy_since_answer += elapsed
            pace = self.cost.seconds_per_byte
            if pace:
                self._backlog = max(0.0, self._backlog - elapsed / pace)
        self._clock = now

    def _start(self, size: float, now: float) -> None:
        self._tick(now)
        self.in_flight += 1
        self._in_flight_bytes += size
        self._backlog += size

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._waiting_bytes = max(0.0, self._waiting_bytes - waiter.size)

    def _room(self, deadline: float | None, size: float, now: float) -> str | None:
        """Whether a newcomer may wait for a slot: None if so, else why not."""
        expected = self.expected_wait_s()
        if expected is None:  # no pace learnt yet: bounded by count
            auto = 2 * self.limit
            cap = auto if self.config.max_waiting == "auto" else self.config.max_waiting
            return "full" if len(self._waiters) >= cap else None
        if self.config.max_waiting != "auto" and len(self._waiters) >= self.config.max_waiting:
            self._overload(now)
            return "full"
        target = self.target_s()
        if expected <= target:
            self._calm_at = now
        elif now - self._calm_at > self.max_wait_s and now >= self.overloaded_until:
            self._overload(now, shed=False)  # a queue fed as fast as it drains: it stood longer than the budget
        if now < self.overloaded_until and expected > target:
            self._overload(now)
            return "full"
        if deadline is not None:  # the caller's deadline is its budget, longer or shorter than max_wait_s
            own = (self.cost.seconds_per_byte or 0.0) * size
            if expected + own > deadline - now:
                return "late"  # one caller's deadline says nothing of the load: the route stays as it is
        elif expected > self.max_wait_s:
            self._overload(now)
            return "full"
        return None

    def _overload(self, now: float, *, shed: bool = True) -> None:
        """Demand past what the budget holds: overloaded for a while, and (``shed``) the waiters past the target
        refused."""
        self.overloaded_until = now + max(_MIN_HOLD_S, _HOLD_PERIODS * self.config.retry_after_s)
        pace = self.cost.seconds_per_byte
        if pace is None or not shed:
            return
        self._tick(now)
        ahead = self._backlog
        target = self.target_s()
        for waiter in list(self._waiters):
            if pace * ahead > target and not waiter.future.done():
                self._forget(waiter)
                waiter.future.set_result(False)
            else:
                ahead += waiter.size
