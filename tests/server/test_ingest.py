"""Ingest workers as a whole (``modelsvc serve --workers 2``): one server as clients see it, across processes.

Counted once: statistics and metrics after traffic over many connections (the kernel spreads them over the
workers); model control through one worker seen through all; a worker killed mid-request fails only the requests
it held and is started again; SIGTERM drains every worker; the engine gone ends the workers (the pod ends).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from modelsvc.tools import onnx_models as om
from tests._python_models import write_python_model
from tests._server import ModelsvcProcess, wait_for
from tests.conftest import identity_config
from tests.server._ingest import workers_server

pytestmark = pytest.mark.integration

SLOW_PY = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy())]) for r in requests]
"""
SLOW_CONFIG = """name: "slow"
backend: "python"
max_batch_size: 16
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""
ROW = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ingest")
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    write_python_model(repo, "slow", SLOW_PY, SLOW_CONFIG)
    return repo


def infer_body(model: str = "identity") -> tuple[bytes, dict[str, str]]:
    if model == "identity":
        data, shape = ROW.tobytes(), [1, 16]
        name = "INPUT0"
    else:
        data, shape = np.ones((1, 4), np.float32).tobytes(), [1, 4]
        name = "IN"
    tensor = {"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": len(data)}}
    head = json.dumps({"inputs": [tensor]})
    return head.encode() + data, {"Inference-Header-Content-Length": str(len(head))}


def post_fresh(server: ModelsvcProcess, model: str = "identity", timeout: float = 30) -> int | str:
    """One inference on a connection of its own (so the kernel picks a worker for it): its status, or the error."""
    body, headers = infer_body(model)
    try:
        url = f"{server.base}/v2/models/{model}/infer"
        return httpx.post(url, content=body, headers=headers, timeout=timeout).status_code
    except httpx.TransportError as exc:
        return type(exc).__name__


def metric(server: ModelsvcProcess, name: str) -> dict[str, float]:
    """Every sample of ``name`` on the metrics port, by its label text."""
    text = httpx.get(server.metrics_url, timeout=10).text
    return {labels or "": float(value) for labels, value in re.findall(rf"^{name}(?:\{{(.*)\}})? (\S+)$", text, re.M)}


def workers_of(server: ModelsvcProcess) -> list[int]:
    """The pids of the engine's ingest workers (its children running ``modelsvc.server.ingest``)."""
    assert server.proc is not None
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == server.proc.pid and b"modelsvc.server.ingest" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


@pytest.fixture
def server(repository: Path) -> Iterator[ModelsvcProcess]:
    with workers_server(repository) as proc:
        wait_for(lambda: len(workers_of(proc)) == 2, "two workers")
        yield proc


def test_statistics_and_metrics_count_every_request_once_across_the_workers(server: ModelsvcProcess) -> None:
    statuses = [post_fresh(server) for _ in range(40)]
    client = None
    for _ in range(20):  # a channel each: a connection each
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(ROW)
        np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), ROW)
        client.close()
    assert statuses == [200] * 40
    stats = server.model_stats("identity")
    assert stats["inference_count"] == 60
    assert stats["inference_stats"]["success"]["count"] == 60
    assert metric(server, "nv_inference_request_success")['model="identity",version="1"'] == 60.0
    per_worker = metric(server, "modelsvc_ingest_requests")
    assert sum(per_worker.values()) == 60
    assert len([v for v in per_worker.values() if v > 0]) == 2, per_worker  # both workers took connections
    assert metric(server, "modelsvc_ingest_workers") == {"": 2.0}


def test_model_control_through_one_worker_is_seen_through_all(repository: Path) -> None:
    with workers_server(repository, "--model-control-mode", "explicit") as proc:
        assert httpx.get(f"{proc.base}/v2/models/identity/ready", timeout=5).status_code == 400
        assert httpx.post(f"{proc.base}/v2/repository/models/identity/load", timeout=30).status_code == 200
        assert {httpx.get(f"{proc.base}/v2/models/identity/ready", timeout=5).status_code for _ in range(20)} == {200}
        assert {post_fresh(proc) for _ in range(20)} == {200}
        assert len([v for v in metric(proc, "modelsvc_ingest_requests").values() if v > 0]) == 2
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}")
        grpc.unload_model("identity")
        grpc.close()
        assert {httpx.get(f"{proc.base}/v2/models/identity/ready", timeout=5).status_code for _ in range(20)} == {400}
        index = httpx.post(f"{proc.base}/v2/repository/index", timeout=5).json()
        assert [(m["name"], m.get("state")) for m in index if m["name"] == "identity"] == [("identity", "UNAVAILABLE")]


def concurrently(n: int, call: object) -> tuple[list[object], list[threading.Thread]]:
    results: list[object] = [None] * n

    def one(i: int) -> None:
        results[i] = call()  # type: ignore[operator]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return results, threads


def test_a_killed_worker_fails_only_its_requests_and_is_started_again(server: ModelsvcProcess) -> None:
    before = workers_of(server)
    results, threads = concurrently(12, lambda: post_fresh(server, "slow"))
    wait_for(lambda: sum(metric(server, "modelsvc_ingest_requests").values()) == 12, "12 requests at the engine")
    os.kill(before[0], signal.SIGKILL)
    for t in threads:
        t.join(30)
    lost = [r for r in results if r != 200]
    assert lost, results  # the killed worker's requests failed
    assert len(lost) < 12, results  # the other's were answered
    assert all(isinstance(r, str) for r in lost), results  # as a closed connection, not a status
    wait_for(lambda: len(workers_of(server)) == 2 and workers_of(server) != before, "the worker started again")
    wait_for(lambda: metric(server, "modelsvc_ingest_workers") == {"": 2.0}, "it to reach the engine")
    assert metric(server, "modelsvc_ingest_worker_restarts") == {"": 1.0}
    assert {post_fresh(server) for _ in range(20)} == {200}
    assert server.proc is not None
    assert server.proc.poll() is None


def test_sigterm_drains_every_worker(server: ModelsvcProcess) -> None:
    workers = workers_of(server)
    results, threads = concurrently(8, lambda: post_fresh(server, "slow"))
    wait_for(lambda: sum(metric(server, "modelsvc_ingest_requests").values()) == 8, "8 requests at the engine")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert results == [200] * 8
    assert server.proc.wait(30) == 0, server.log()
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_the_engine_gone_ends_the_workers(server: ModelsvcProcess) -> None:
    workers = workers_of(server)
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and [pid for pid in workers if _alive(pid)]:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
