"""When to try again: exponential backoff with full jitter, bounded by a retry budget.

Retries of an overloaded server make the overload worse; the budget caps them to a fraction of the
calls made (plus a small floor), so a fleet of clients cannot multiply its load by the attempt count.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import ClientError, ConnectError, ServerUnavailable


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``attempts`` is the total number of tries (1 = no retry)."""

    attempts: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    retry_on: tuple[type[ClientError], ...] = (ConnectError, ServerUnavailable)

    def should_retry(self, error: ClientError, attempt: int) -> bool:
        """After try number ``attempt`` (1-based) failed with ``error``."""
        return attempt < self.attempts and isinstance(error, self.retry_on)

    def delay_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**(attempt-1))]."""
        cap = min(self.max_backoff_s, self.backoff_s * (2.0 ** (attempt - 1)))
        return float(cap * rand())


NO_RETRY = RetryPolicy(attempts=1)


class RetryBudget:
    """A token bucket of retries, shared by every call of one client (thread-safe).

    Each call earns ``ratio`` of a retry and time adds ``min_per_s`` retries per second, up to ``burst``
    saved; a retry spends one. So retries add at most about ``ratio`` of the load, however the attempts
    are configured, and a client that made few calls can still retry a little.
    """

    def __init__(self, ratio: float = 0.2, min_per_s: float = 1.0, burst: float = 10.0) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.burst = burst
        self._tokens = burst
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.min_per_s)
        self._last = now

    def record_call(self) -> None:
        with self._lock:
            self._tokens = min(self.burst, self._tokens + self.ratio)

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when spent."""
        with self._lock:
            self._refill()
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True
