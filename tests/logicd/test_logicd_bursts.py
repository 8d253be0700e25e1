"""Bursts served, storms refused (issue 29): admission by expected wait, on real processes.

A python model that sleeps what each request asks, one request at a time, behind a logic server whose route takes
one request at a time (``max_in_flight: 1``), so the time a request waits is the sum of what is ahead of it. The
gate learns the pace from the answers; a burst whose expected wait fits the budget (the caller's deadline, or
``max_wait_s``) waits its turn, the same number of longer requests is refused with Retry-After, and a storm is held
to about one request's wait while it lasts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests._server import LogicdProcess, ModelsvcProcess
from tests.client.test_client_deadline import CONFIG
from tests.logicd.test_logicd_admission import _burst, _metric, _problem, _service, _sleeper

pytestmark = pytest.mark.integration

MODEL_CONFIG = CONFIG + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
"""The client tests' sleeper, one request at a time."""

ONE_AT_A_TIME = "admission:\n  max_in_flight: 1\n  retry_after_s: 1\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    with _sleeper(tmp_path_factory.mktemp("repo"), MODEL_CONFIG) as process:
        yield process


def _logic(tmp_path: Path, models: ModelsvcProcess, max_wait_s: float) -> LogicdProcess:
    return LogicdProcess(_service(tmp_path / "svc", f"{ONE_AT_A_TIME}  max_wait_s: {max_wait_s}\n"), models.base)


def _teach(base: str, seconds: float, count: int = 5) -> None:
    """``count`` requests one after another: the gate learns what a request of ``seconds`` costs."""
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(count):
            assert client.post("/v1/sleep", json={"seconds": seconds}).status_code == 200


def _split(answers: list[tuple[httpx.Response, float]]) -> tuple[list[float], list[tuple[httpx.Response, float]]]:
    statuses = {response.status_code for response, _ in answers}
    assert statuses <= {200, 503}, [response.text for response, _ in answers if response.status_code not in (200, 503)]
    ok = [elapsed for response, elapsed in answers if response.status_code == 200]
    return ok, [(response, elapsed) for response, elapsed in answers if response.status_code == 503]


def _gauge(base: str, name: str) -> float:
    return _metric(base, f'{name}{{route="/v1/sleep"}}')


def _until_calm(base: str) -> None:
    """Wait for the route to leave its overloaded state (it holds it 2 x Retry-After after the last refusal)."""
    end = time.monotonic() + 15
    while _gauge(base, "logicd_admission_overloaded") and time.monotonic() < end:
        time.sleep(0.25)
    assert _gauge(base, "logicd_admission_overloaded") == 0


def test_the_same_burst_waits_when_it_fits_and_is_refused_when_it_does_not(
    tmp_path: Path, models: ModelsvcProcess
) -> None:
    """Ten requests at once, one slot, a budget of 2 s: of 50 ms each (0.5 s of work) all wait their turn, where
    a count of twice the slots would have refused seven; of 500 ms each (5 s of work) most are refused at once,
    with Retry-After, before any is answered, and the route turns overloaded."""
    with _logic(tmp_path, models, 2.0) as logic:
        _teach(logic.base, 0.05)
        ok, refused = _split(asyncio.run(_burst(logic.base, 10, 0.05)))
        assert (len(ok), len(refused)) == (10, 0)
        assert _gauge(logic.base, "logicd_admission_overloaded") == 0

        _teach(logic.base, 0.5)
        # the route is overloaded from the refusals until 2 x Retry-After after the last one: watched while the
        # burst runs (its answers take about as long, so a look afterwards may come too late on a slow machine)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(asyncio.run, _burst(logic.base, 10, 0.5))
            overloaded = 0.0
            while not running.done():
                overloaded = max(overloaded, _gauge(logic.base, "logicd_admission_overloaded"))
                time.sleep(0.05)
            ok, refused = _split(running.result())
        assert len(ok) <= 4, (len(ok), len(refused))
        assert len(refused) >= 6, (len(ok), len(refused))
        for response, elapsed in refused:
            assert response.headers["retry-after"] == "1"
            assert "at capacity" in _problem(response, 503)["detail"]
            assert elapsed < min(ok)
        assert overloaded == 1

        # once the storm has passed (no refusal for 2 x Retry-After), a burst that fits is served whole again
        _until_calm(logic.base)
        _teach(logic.base, 0.05, count=10)
        ok, refused = _split(asyncio.run(_burst(logic.base, 10, 0.05)))
        assert (len(ok), len(refused)) == (10, 0)


def test_a_storm_is_held_to_about_one_request_of_wait(tmp_path: Path, models: ModelsvcProcess) -> None:
    """Sixteen callers that honour Retry-After send 200 ms requests for 4 s against a budget of 1.5 s: the first
    wave (3.2 s of work) overflows the budget and turns the route overloaded, the waiters past one request's wait
    are refused, and from then on at most about one request waits behind the one running; every refusal carries
    Retry-After, none after waiting out the budget, and they come back faster than any answer (the median of
    them: on shared cores a refusal can wait for the CPU)."""
    with _logic(tmp_path, models, 1.5) as logic:
        _teach(logic.base, 0.2)
        outcomes: list[tuple[int, float, str | None]] = []
        waiting: list[float] = []

        async def storm() -> None:
            end = time.monotonic() + 4.0
            async with httpx.AsyncClient(base_url=logic.base, timeout=30) as client:

                async def caller() -> None:
                    while time.monotonic() < end:
                        start = time.monotonic()
                        response = await client.post("/v1/sleep", json={"seconds": 0.2})
                        retry_after = response.headers.get("retry-after")
                        outcomes.append((response.status_code, time.monotonic() - start, retry_after))
                        if response.status_code == 503:
                            await asyncio.sleep(float(retry_after or 1))

                async def watch() -> None:
                    await asyncio.sleep(1.0)  # past the first wave
                    while time.monotonic() < end:
                        text = (await client.get("/metrics")).text
                        waiting.extend(
                            float(line.rsplit(" ", 1)[1])
                            for line in text.splitlines()
                            if line.startswith('logicd_admission_waiting{route="/v1/sleep"}')
                        )
                        await asyncio.sleep(0.1)

                await asyncio.gather(watch(), *(caller() for _ in range(16)))

        asyncio.run(storm())
        ok = [elapsed for status, elapsed, _ in outcomes if status == 200]
        refused = [(elapsed, retry_after) for status, elapsed, retry_after in outcomes if status == 503]
        assert {status for status, _, _ in outcomes} == {200, 503}
        assert len(refused) > len(ok) > 0
        assert all(retry_after == "1" for _, retry_after in refused)
        assert sorted(elapsed for elapsed, _ in refused)[len(refused) // 2] < min(ok)  # the median: a shared CPU
        assert _metric(logic.base, 'logicd_admission_refused_total{reason="waited"') == 0  # none waited in vain
        assert waiting
        assert max(waiting) <= 2, waiting  # the 1.5 s budget alone would have let 7 wait


def test_the_callers_deadline_is_the_budget(tmp_path: Path, models: ModelsvcProcess) -> None:
    """Six 300 ms requests at once, against a ``max_wait_s`` of 1 s: each with ``Request-Timeout: 30`` they all wait
    their turn (the caller's deadline is the budget, longer than the default); each with ``Request-Timeout: 1`` only
    those expected to finish within it are let in, and the rest are refused at once with 503 and Retry-After (not
    left to wait into a 504)."""
    with _logic(tmp_path, models, 1.0) as logic:
        _teach(logic.base, 0.3)
        ok, refused = _split(asyncio.run(_burst(logic.base, 6, 0.3, {"Request-Timeout": "30"})))
        assert (len(ok), len(refused)) == (6, 0)

        ok, refused = _split(asyncio.run(_burst(logic.base, 6, 0.3, {"Request-Timeout": "1"})))
        assert 1 <= len(ok) <= 4, (len(ok), len(refused))
        assert len(refused) >= 2, (len(ok), len(refused))
        for response, elapsed in refused:
            assert "deadline" in _problem(response, 503)["detail"]
            assert response.headers["retry-after"] == "1"
            assert elapsed < min(ok)
        assert _gauge(logic.base, "logicd_admission_overloaded") == 0  # short deadlines are no storm
