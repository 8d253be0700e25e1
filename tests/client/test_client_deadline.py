"""The client's deadline (``modelsvc.client.deadline``) against a real modelsvc: calls end by it, none is sent
after it, and a request still queued when its caller's deadline passes is dropped by the server, not run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from modelsvc.client import AsyncClient, Client, Timeout, current_deadline, deadline
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

SLEEPER = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds.max()))
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT", seconds)]))
        return answers
"""

CONFIG = """
name: "sleeper"
backend: "python"
max_batch_size: 1
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SLEPT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { default_queue_policy { allow_timeout_override: true } }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo: Path = tmp_path_factory.mktemp("repo")
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "1" / "model.py").write_text(SLEEPER)
    (repo / "sleeper" / "config.pbtxt").write_text(CONFIG)
    with ModelsvcProcess(repo) as process:
        yield process


def _seconds(value: float) -> dict[str, np.ndarray]:
    return {"SECONDS": np.array([[value]], np.float32)}


def _executed(server: ModelsvcProcess) -> int:
    return int(server.model_stats("sleeper")["execution_count"])


def test_deadline_nests_to_the_earlier_and_is_scoped() -> None:
    assert current_deadline() is None
    with deadline(10.0) as outer:
        assert outer is not None
        with deadline(60.0) as inner:
            assert inner == outer  # a later deadline does not extend the caller's
        with deadline(0.5) as inner:
            assert inner is not None
            assert inner < outer
        assert current_deadline() == outer
    assert current_deadline() is None
    with pytest.raises(ValueError, match="not both"), deadline(1.0, at=time.monotonic()):
        pass


def test_a_call_after_the_deadline_is_not_sent(server: ModelsvcProcess) -> None:
    with Client(server.url) as client:
        before = _executed(server)
        with deadline(at=time.monotonic() - 1), pytest.raises(Timeout, match="deadline has passed"):
            client.infer("sleeper", _seconds(0))
        assert _executed(server) == before


def test_a_call_ends_by_the_deadline(server: ModelsvcProcess) -> None:
    with Client(server.url, timeout=30) as client:
        start = time.monotonic()
        with deadline(0.3), pytest.raises(Timeout):
            client.infer("sleeper", _seconds(1.5))
        assert time.monotonic() - start < 1.2  # the client's own 30 s were cut to the deadline
    time.sleep(1.5)  # the abandoned request, already executing, runs to its end: let the next test find it idle


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_queued_request_is_dropped_once_its_caller_gave_up(server: ModelsvcProcess, scheme: str) -> None:
    """One request keeps the only instance busy for 1 s; another, queued behind it under a 0.3 s deadline,
    is dropped by the server when its timeout (Triton's ``timeout`` parameter) expires in the queue."""
    url = server.url if scheme == "http" else f"grpc://127.0.0.1:{server.grpc_port}"
    before = _executed(server)

    def busy() -> None:
        with Client(server.url) as other:
            other.infer("sleeper", _seconds(1.0))

    blocker = threading.Thread(target=busy)
    blocker.start()
    time.sleep(0.2)  # the first request is executing
    with Client(url, timeout=30) as client, deadline(0.3), pytest.raises(Timeout):
        client.infer("sleeper", _seconds(0.01))
    blocker.join()
    time.sleep(0.2)
    assert _executed(server) == before + 1  # the second never ran
    failed = server.model_stats("sleeper")["inference_stats"]["fail"]["count"]
    assert int(failed) >= 1


async def test_async_calls_carry_each_tasks_own_deadline(server: ModelsvcProcess) -> None:
    async with AsyncClient(server.url, timeout=30) as client:

        async def call(budget: float, seconds: float) -> str:
            with deadline(budget):
                try:
                    await client.infer("sleeper", _seconds(seconds))
                except Timeout:
                    return "timeout"
                return "ok"

        quick, slow = await asyncio.gather(call(5.0, 0.01), call(0.2, 1.0))
    assert (quick, slow) == ("ok", "timeout")
