"""Queue policies, abandoned requests, shutdown and start-up failures, on real server processes."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

ROW = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
WAIT = 20.0


def metric(server: ModelsvcProcess, name: str, model: str) -> float:
    text = httpx.get(server.metrics_url).text
    prefix = f'{name}{{model="{model}",version="1"}} '
    line = next(ln for ln in text.splitlines() if ln.startswith(prefix))
    return float(line[len(prefix) :])


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_queue_timeout_rejects_at_its_deadline(server):
    """'timed' waits 60 s for a batch, but its queue policy rejects after 200 ms."""
    async with httpx.AsyncClient(base_url=server.base, timeout=WAIT) as c:
        t0 = time.monotonic()
        r = await c.post("/v2/models/timed/infer", content=json.dumps(ROW))
        waited = time.monotonic() - t0
        assert r.status_code == 503
        assert "timeout expired" in r.json()["error"]
        assert 0.2 <= waited < 5.0  # the 60 s batch delay never came into it
        r = await c.post("/v2/models/timed/infer", content=json.dumps({**ROW, "parameters": {"timeout": 50_000}}))
        assert r.status_code == 503


async def test_full_queue_answers_at_once_and_abandoned_request_never_runs(server):
    """'bounded' holds requests for 60 s with room for one: a second is refused, the first is abandoned."""
    before = server.model_stats("bounded")["execution_count"]
    first_client = httpx.AsyncClient(base_url=server.base, timeout=WAIT)
    first = asyncio.ensure_future(first_client.post("/v2/models/bounded/infer", content=json.dumps(ROW)))
    await until(lambda: metric(server, "nv_inference_pending_request_count", "bounded") == 1, "a queued request")
    async with httpx.AsyncClient(base_url=server.base, timeout=WAIT) as c:
        r = await c.post("/v2/models/bounded/infer", content=json.dumps(ROW))
    assert r.status_code == 503
    assert "maximum queue size of 1" in r.json()["error"]
    first.cancel()  # the client goes away
    await first_client.aclose()
    await until(
        lambda: metric(server, "nv_inference_pending_request_count", "bounded") == 0,
        "the abandoned request to leave the queue",
    )
    assert server.model_stats("bounded")["execution_count"] == before
    assert server.model_stats("bounded")["inference_stats"]["fail"]["count"] >= 2


@pytest.mark.parametrize("workers", ["0", "2"], ids=["one process", "two ingest workers"])
async def test_sigterm_finishes_in_flight_requests_and_exits_zero(tmp_path, workers):
    om.write_model(
        tmp_path,
        "slow",
        om.identity(),
        identity_config("slow", extra="dynamic_batching { max_queue_delay_microseconds: 1500000 }"),
    )
    proc = ModelsvcProcess(tmp_path, "--workers", workers)
    with proc:
        async with httpx.AsyncClient(base_url=proc.base, timeout=WAIT) as c:
            pending = asyncio.ensure_future(c.post("/v2/models/slow/infer", content=json.dumps(ROW)))
            await until(lambda: metric(proc, "nv_inference_pending_request_count", "slow") == 1, "queued")
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            r = await pending
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"] == [0.5] * 16
        assert proc.wait_exit() == 0
    assert "draining" in proc.log()


def write_bad_repository(repo):
    om.write_model(repo, "good", om.identity(), identity_config("good"))
    om.write_model(
        repo,
        "broken",
        om.identity(),
        'name: "broken"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }\n'
        "output oops\n",
    )
    return repo


def test_exit_on_error_true_refuses_to_start_and_names_file_line_column(tmp_path):
    proc = ModelsvcProcess(write_bad_repository(tmp_path)).start()
    assert proc.wait_exit() != 0
    log = proc.log()
    assert f"{tmp_path / 'broken' / 'config.pbtxt'}:4:" in log


def test_exit_on_error_false_serves_the_good_models(tmp_path):
    proc = ModelsvcProcess(write_bad_repository(tmp_path), "--exit-on-error", "false").start()
    try:
        # starts, but is not ready: a model that should load did not
        deadline = time.monotonic() + WAIT
        while True:
            try:
                if httpx.get(f"{proc.base}/v2/health/live").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.05)
        assert httpx.get(f"{proc.base}/v2/health/ready").status_code == 400
        client = httpclient.InferenceServerClient(proc.url)
        index = {r["name"]: r for r in client.get_model_repository_index()}
        assert index["good"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "config.pbtxt:4:" in index["broken"]["reason"]
        inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(np.ones((1, 16), np.float32))
        assert client.infer("good", [inp]).as_numpy("OUTPUT0").shape == (1, 16)
        client.close()
    finally:
        proc.terminate()


def test_strict_model_config_needs_a_config(tmp_path):
    om.write_model(tmp_path, "bare", om.identity(), None)
    proc = ModelsvcProcess(tmp_path, "--strict-model-config", "true").start()
    assert proc.wait_exit() != 0
    assert "bare" in proc.log()


def test_gpu_model_is_refused_without_a_gpu_unless_fallback_is_allowed(tmp_path):
    gpu = "instance_group [ { kind: KIND_GPU } ]"
    om.write_model(tmp_path, "gpu_strict", om.identity(), identity_config("gpu_strict", extra=gpu))
    om.write_model(
        tmp_path,
        "gpu_fallback",
        om.identity(),
        identity_config(
            "gpu_fallback",
            extra=gpu + '\nparameters { key: "allow_cpu_fallback" value { string_value: "true" } }',
        ),
    )
    proc = ModelsvcProcess(tmp_path, "--exit-on-error", "false").start()
    try:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                index = httpx.post(f"{proc.base}/v2/repository/index").json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.05)
        rows = {r["name"]: r for r in index}
        if rows["gpu_strict"]["state"] == "READY":
            pytest.skip("this machine has a working CUDA provider")
        assert rows["gpu_strict"]["state"] == "UNAVAILABLE"
        assert "KIND_GPU" in rows["gpu_strict"]["reason"]
        assert rows["gpu_fallback"]["state"] == "READY"
        text = httpx.get(proc.metrics_url).text
        assert (
            'modelsvc_model_execution_provider{model="gpu_fallback",version="1",provider="CPUExecutionProvider"} 1.0'
            in text
        )
    finally:
        proc.terminate()


@pytest.mark.parametrize("workers", ["0", "2"], ids=["one process", "two ingest workers"])
async def test_sigterm_runs_requests_held_by_a_long_batch_delay(tmp_path, workers):
    """A request waiting out a 60 s max_queue_delay is run at shutdown, not dropped after the grace period."""
    om.write_model(
        tmp_path,
        "held",
        om.identity(),
        identity_config("held", extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }"),
    )
    proc = ModelsvcProcess(tmp_path, "--workers", workers)
    with proc:
        async with httpx.AsyncClient(base_url=proc.base, timeout=WAIT) as c:
            pending = asyncio.ensure_future(c.post("/v2/models/held/infer", content=json.dumps(ROW)))
            await until(lambda: metric(proc, "nv_inference_pending_request_count", "held") == 1, "queued")
            t0 = time.monotonic()
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            r = await pending
        assert r.status_code == 200
        assert time.monotonic() - t0 < 15  # well before the 30 s grace period or the 60 s delay
        assert proc.wait_exit() == 0
