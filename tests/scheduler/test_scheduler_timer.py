"""The batch delay's timer (modelsvc.scheduler._timer.DeadlineTimer): a timerfd on Linux, the loop's timer elsewhere."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
import uvloop

from modelsvc.scheduler import _timer
from modelsvc.scheduler._timer import DeadlineTimer

LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio"), pytest.param(uvloop.new_event_loop, id="uvloop")]


def run(factory, coro_fn):  # type: ignore[no-untyped-def]
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_fn())


@pytest.fixture(params=[True, False], ids=["timerfd", "loop-timer"])
def precise(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setattr(_timer, "_TIMERFD", None)
    elif _timer._TIMERFD is None:
        pytest.skip("no timerfd on this platform")
    return bool(request.param)


@pytest.mark.parametrize("factory", LOOPS)
def test_fires_once_at_or_after_the_deadline_on_the_loop_thread(factory, precise: bool) -> None:  # type: ignore[no-untyped-def]
    async def body() -> list[tuple[int, bool]]:
        loop = asyncio.get_running_loop()
        calls: list[tuple[int, bool]] = []
        done = loop.create_future()

        def fired() -> None:
            calls.append((time.perf_counter_ns(), loop.is_running()))
            if not done.done():
                done.set_result(None)

        timer = DeadlineTimer(loop, fired)
        assert timer.precise is precise
        due = time.perf_counter_ns() + 3_000_000
        timer.arm(due)
        assert timer.due_ns == due
        await asyncio.wait_for(done, 2)
        await asyncio.sleep(0.01)  # no second call
        assert timer.due_ns is None
        timer.close()
        return [(t - due, running) for t, running in calls]

    calls = run(factory, body)
    assert len(calls) == 1
    late_ns, on_loop = calls[0]
    assert on_loop
    if precise:  # the loop's own timers may fire up to a millisecond early; a timerfd never does
        assert late_ns >= 0


@pytest.mark.parametrize("factory", LOOPS)
def test_arm_replaces_the_deadline_and_cancel_disarms(factory, precise: bool) -> None:  # type: ignore[no-untyped-def]
    async def body() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        calls: list[int] = []
        timer = DeadlineTimer(loop, lambda: calls.append(time.perf_counter_ns()))
        now = time.perf_counter_ns()
        timer.arm(now + 2_000_000)
        later = now + 40_000_000
        timer.arm(later)  # replaces: nothing at 2 ms
        await asyncio.sleep(0.015)
        early_calls = len(calls)
        timer.cancel()
        assert timer.due_ns is None
        await asyncio.sleep(0.05)
        timer.cancel()  # twice is fine
        timer.close()
        return early_calls, len(calls)

    assert run(factory, body) == (0, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_close_releases_the_descriptor() -> None:
    if _timer._TIMERFD is None:
        pytest.skip("no timerfd here")

    async def body() -> int:
        timer = DeadlineTimer(asyncio.get_running_loop(), lambda: None)
        fd = timer._fd
        assert fd >= 0
        assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[timerfd]"
        timer.arm(time.perf_counter_ns() + 10**9)
        timer.close()
        timer.close()
        return fd

    fd = run(uvloop.new_event_loop, body)
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[timerfd]"


def test_a_deadline_in_the_past_fires_at_once() -> None:
    async def body() -> int:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        timer = DeadlineTimer(loop, lambda: done.set_result(time.perf_counter_ns()))
        t0 = time.perf_counter_ns()
        timer.arm(t0 - 5_000_000)
        fired: int = await asyncio.wait_for(done, 2)
        timer.close()
        return fired - t0

    assert run(uvloop.new_event_loop, body) < 1_000_000_000
