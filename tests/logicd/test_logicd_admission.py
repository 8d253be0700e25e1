"""Admission on real processes: a route takes a bounded number of requests and refuses the rest at once with
503 and Retry-After (problem+json); the caller's deadline header bounds the wait, the handler and the model
call, and a request still queued in modelsvc when its caller's deadline passes is dropped there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from logicd._admission import Capacity, DeadlineError, parse_deadline
from tests._server import LogicdProcess, ModelsvcProcess
from tests.client.test_client_deadline import SLEEPER

pytestmark = pytest.mark.integration

MODEL_CONFIG = """
name: "sleeper"
backend: "python"
max_batch_size: 4
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SLEPT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { default_queue_policy { allow_timeout_override: true max_queue_size: 3 } }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

SERVICE = """
import msgspec
import numpy as np
from logicd import Context, Service

service = Service()


class Sleep(msgspec.Struct):
    seconds: float


class Slept(msgspec.Struct):
    seconds: float


@service.post("/v1/sleep")
async def sleep(request: Sleep, ctx: Context) -> Slept:
    out = await ctx.model("sleeper").infer(SECONDS=np.array([[request.seconds]], np.float32))
    return Slept(seconds=float(out["SLEPT"][0][0]))


@service.post("/v1/auto")
async def auto(request: Sleep, ctx: Context) -> Slept:
    out = await ctx.model("sleeper").infer(SECONDS=np.array([[request.seconds]], np.float32))
    return Slept(seconds=float(out["SLEPT"][0][0]))
"""


def _service(folder: Path, admission: str) -> Path:
    folder.mkdir()
    (folder / "sleep_service.py").write_text(SERVICE)
    (folder / "service.yaml").write_text(
        f"""name: sleep-svc
service: sleep_service:service
model_service:
  url: http://127.0.0.1:1
  timeout_s: 30
  retries: 0
models: [sleeper]
{admission}"""
    )
    return folder


def _sleeper(repo: Path, config: str) -> ModelsvcProcess:
    """A model service (not started yet) on ``repo`` holding the sleeper model with ``config``."""
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "1" / "model.py").write_text(SLEEPER)
    (repo / "sleeper" / "config.pbtxt").write_text(config)
    return ModelsvcProcess(repo)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    with _sleeper(tmp_path_factory.mktemp("repo"), MODEL_CONFIG) as process:
        yield process


@pytest.fixture(scope="module")
def logic(tmp_path_factory: pytest.TempPathFactory, models: ModelsvcProcess) -> Iterator[LogicdProcess]:
    admission = "admission:\n  max_in_flight: 2\n  max_waiting: 1\n  retry_after_s: 3\n"
    folder = _service(tmp_path_factory.mktemp("svc") / "svc", admission)
    with LogicdProcess(folder, models.base) as process:
        yield process


def _problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    return body


async def _burst(base: str, count: int, seconds: float, headers: dict[str, str] | None = None) -> list:
    """``count`` concurrent requests; each answer with the time it took."""
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=count)) as client:

        async def one() -> tuple[httpx.Response, float]:
            start = time.monotonic()
            response = await client.post("/v1/sleep", json={"seconds": seconds}, headers=headers)
            return response, time.monotonic() - start

        return list(await asyncio.gather(*(one() for _ in range(count))))


def _metric(base: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_parse_deadline_headers() -> None:
    assert parse_deadline({}) is None
    assert parse_deadline({"request-timeout": "1.5"}) == 1.5
    assert parse_deadline({"grpc-timeout": "250m"}) == pytest.approx(0.25)
    assert parse_deadline({"grpc-timeout": "2S", "request-timeout": "1"}) == 1.0  # the smaller
    assert parse_deadline({"grpc-timeout": "99999999H"}) == 86_400.0
    for bad in ({"request-timeout": "abc"}, {"request-timeout": "0"}, {"request-timeout": "-1"}):
        with pytest.raises(DeadlineError, match="Request-Timeout"):
            parse_deadline(bad)
    for text in ("5X", "123456789S", "0m", "1.5S", ""):
        with pytest.raises(DeadlineError, match="grpc-timeout"):
            parse_deadline({"grpc-timeout": text})


def test_capacity_from_model_config() -> None:
    config = {
        "max_batch_size": 16,
        "instance_group": [{"count": 2}, {"count": 1}],
        "dynamic_batching": {"default_queue_policy": {"max_queue_size": 5, "default_timeout_microseconds": 250000}},
        "parameters": {"max_batch_tokens": {"string_value": "2048"}},
    }
    capacity = Capacity.from_config(config)
    assert (capacity.instances, capacity.max_queue_size, capacity.queue_timeout_s) == (3, 5, 0.25)
    assert capacity.rows(512) == 2 * 3 * 4 + 5  # 2048 tokens hold 4 windows of 512
    assert capacity.rows(64) == 2 * 3 * 16 + 5  # short windows: max_batch_size bounds the batch
    plain = Capacity.from_config({"max_batch_size": 0})
    assert (plain.instances, plain.rows(1), plain.queue_timeout_s) == (1, 2, None)


def test_overload_is_refused_at_once_and_nothing_is_lost(logic: LogicdProcess) -> None:
    """8 at once against 2 slots and 1 waiting place: 3 answered, 5 refused, and every refusal comes back
    before the first answer does (the refusals wait for nothing)."""
    before = _metric(logic.base, 'logicd_admission_refused_total{reason="full"')
    answers = asyncio.run(_burst(logic.base, 8, 0.5))
    ok = [elapsed for response, elapsed in answers if response.status_code == 200]
    refused = [(response, elapsed) for response, elapsed in answers if response.status_code == 503]
    assert (len(ok), len(refused)) == (3, 5), [r.status_code for r, _ in answers]
    for response, elapsed in refused:
        body = _problem(response, 503)
        assert "at capacity" in body["detail"]
        assert response.headers["retry-after"] == "3"
        assert elapsed < min(ok)
    assert _metric(logic.base, 'logicd_admission_refused_total{reason="full"') == before + 5
    # the pair recovers at once: the next request is admitted
    assert httpx.post(f"{logic.base}/v1/sleep", json={"seconds": 0}, timeout=30).status_code == 200


def test_deadline_header_ends_the_request_with_504(logic: LogicdProcess) -> None:
    for headers in ({"Request-Timeout": "0.3"}, {"grpc-timeout": "300m"}):
        response = httpx.post(f"{logic.base}/v1/sleep", json={"seconds": 1.0}, headers=headers, timeout=30)
        body = _problem(response, 504)
        assert "deadline" in body["detail"] or "in time" in body["detail"]


def test_bad_deadline_header_is_a_400_naming_it(logic: LogicdProcess) -> None:
    response = httpx.post(f"{logic.base}/v1/sleep", json={"seconds": 0}, headers={"Request-Timeout": "soon"})
    assert "Request-Timeout" in _problem(response, 400)["detail"]
    response = httpx.post(f"{logic.base}/v1/sleep", json={"seconds": 0}, headers={"grpc-timeout": "5X"})
    assert "grpc-timeout" in _problem(response, 400)["detail"]


def test_the_deadline_reaches_the_model_service(logic: LogicdProcess, models: ModelsvcProcess) -> None:
    """One request holds the model's only instance for 1 s; another, under a 0.3 s deadline, waits in the
    model service's queue and is dropped there when its deadline passes: it never runs."""
    time.sleep(1.2)  # the previous test's abandoned 1 s request finishes first
    executed = int(models.model_stats("sleeper")["execution_count"])

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=logic.base, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/v1/sleep", json={"seconds": 1.0}))
            await asyncio.sleep(0.2)
            second = await client.post("/v1/sleep", json={"seconds": 0.01}, headers={"Request-Timeout": "0.3"})
            return [await first, second]

    first, second = asyncio.run(run())
    assert first.status_code == 200
    _problem(second, 504)
    time.sleep(0.3)
    assert int(models.model_stats("sleeper")["execution_count"]) == executed + 1


def test_a_waiter_gets_503_after_the_longest_wait(tmp_path: Path, models: ModelsvcProcess) -> None:
    admission = "admission:\n  max_in_flight: 1\n  max_waiting: 4\n  max_wait_s: 0.2\n"
    with LogicdProcess(_service(tmp_path / "svc", admission), models.base) as logic:
        answers = asyncio.run(_burst(logic.base, 3, 1.0))
    statuses = sorted(response.status_code for response, _ in answers)
    assert statuses == [200, 503, 503]
    for response, _ in answers:
        if response.status_code == 503:
            assert "longest wait" in _problem(response, 503)["detail"]


def test_auto_limits_come_from_the_model_config(tmp_path: Path, models: ModelsvcProcess) -> None:
    """max_batch_size 4, one instance, max_queue_size 3: the model holds 2 x 4 + 3 = 11 rows; a request of this
    service sends one row (its cost is not measured: it calls infer directly), so 11 requests at once."""
    with LogicdProcess(_service(tmp_path / "svc", ""), models.base) as logic:
        assert httpx.post(f"{logic.base}/v1/auto", json={"seconds": 0}, timeout=30).status_code == 200
        assert _metric(logic.base, 'logicd_admission_limit{route="/v1/auto"}') == 11
