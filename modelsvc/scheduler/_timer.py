"""A one-shot timer on the event loop, precise to microseconds: the dynamic batcher's queue delay.

Event loop timers count time coarsely: uvloop (libuv) in whole milliseconds of a clock cached at the top of
each loop iteration, asyncio's own loop through epoll's millisecond timeout. A 100 us queue delay then ran
0 to 2 ms, and a 1,000 us delay about 1.2 ms on average under load. On Linux this timer is a ``timerfd``
(CLOCK_MONOTONIC, the clock of ``time.perf_counter_ns``) armed at an absolute deadline in nanoseconds and
watched by the loop like a socket, so the loop wakes when the deadline passes, not at the next millisecond.
Elsewhere (or where the libc call is missing) it falls back to ``loop.call_at``.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sys
import time
from collections.abc import Callable

logger = logging.getLogger("modelsvc.scheduler")

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_timerfd() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """libc's timerfd_create and timerfd_settime, or None where they (or a monotonic perf_counter) are missing."""
    if not sys.platform.startswith("linux"):
        return None
    if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return create, settime


_TIMERFD = _load_timerfd()


class DeadlineTimer:
    """Calls ``callback()`` on ``loop`` once ``time.perf_counter_ns()`` reaches the armed deadline.

    ``arm`` replaces any earlier deadline; ``cancel`` disarms; ``close`` releases the file descriptor. The
    callback may come a few microseconds early on the fallback, never late by a loop's millisecond tick
    on Linux; callers re-check the clock and re-arm, as the scheduler does.
    """

    __slots__ = ("_callback", "_fd", "_handle", "_loop", "_spec", "due_ns")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._spec = _Itimerspec()
        #: the armed deadline (perf_counter_ns), None when disarmed
        self.due_ns: int | None = None
        if _TIMERFD is not None:
            fd = _TIMERFD[0](_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                try:
                    loop.add_reader(fd, self._fired)
                except (NotImplementedError, RuntimeError, OSError):  # a loop that cannot watch descriptors
                    os.close(fd)
                else:
                    self._fd = fd
            else:
                errno = ctypes.get_errno()
                logger.debug("timerfd_create failed (errno %d): the batch delay uses the loop's timer", errno)

    @property
    def precise(self) -> bool:
        """True when the timer is a timerfd (Linux)."""
        return self._fd >= 0

    def arm(self, due_ns: int) -> None:
        """Call back once perf_counter_ns() >= due_ns (replacing any deadline armed before)."""
        self.due_ns = due_ns
        if self._fd >= 0:
            value = self._spec.it_value
            value.tv_sec, value.tv_nsec = divmod(max(due_ns, 1), 1_000_000_000)
            if _TIMERFD[1](self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) == 0:  # type: ignore[index]
                return
            self._close_fd()  # cannot happen with a valid descriptor; keep serving on the loop's timer
        if self._handle is not None:
            self._handle.cancel()
        delay_s = (due_ns - time.perf_counter_ns()) / 1e9
        self._handle = self._loop.call_at(self._loop.time() + delay_s, self._fired_late)

    def cancel(self) -> None:
        if self.due_ns is None:
            return
        self.due_ns = None
        if self._fd >= 0:
            value = self._spec.it_value
            value.tv_sec = value.tv_nsec = 0
            _TIMERFD[1](self._fd, 0, ctypes.byref(self._spec), None)  # type: ignore[index]
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self.cancel()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._loop.remove_reader(fd)
            os.close(fd)

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiration count: reading it re-quiets the descriptor
        except BlockingIOError:  # re-armed or cancelled after it became readable
            return
        self.due_ns = None
        self._callback()

    def _fired_late(self) -> None:
        self._handle = None
        self.due_ns = None
        self._callback()
