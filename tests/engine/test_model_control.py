"""Model management on real servers: model control modes, load and unload requests (tritonclient.http and .grpc),
config and file overrides, reloads under load, failed reloads, ensembles' composing models, and polling."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess, wait_for
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

WAIT = 30.0
NO_LOAD = "explicit model load / unload is not allowed if polling is enabled"
ROW = np.arange(16, dtype=np.float32).reshape(1, 16)
T = TypeVar("T")


def index(proc: ModelsvcProcess) -> dict[tuple[str, str | None], dict[str, Any]]:
    rows = httpx.post(f"{proc.base}/v2/repository/index", timeout=WAIT).json()
    return {(r["name"], r.get("version")): r for r in rows}


def grpc_target(proc: ModelsvcProcess) -> str:
    return f"127.0.0.1:{proc.grpc_port}"


def infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray[Any, Any] = ROW) -> Any:
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def config_json(name: str, max_batch_size: int = 8, extra: dict[str, Any] | None = None) -> str:
    """A complete identity config as the load request's ``config`` parameter."""
    tensor = {"data_type": "TYPE_FP32", "dims": [16]}
    config = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", **tensor}],
        "output": [{"name": "OUTPUT0", **tensor}],
        "dynamic_batching": {},
        **(extra or {}),
    }
    return json.dumps(config)


def ready_server(proc: ModelsvcProcess) -> bool:
    return httpx.get(f"{proc.base}/v2/health/ready").status_code == 200


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    om.write_model(root, "identity", om.identity(), identity_config("identity"))
    om.write_model(root, "other", om.identity(), identity_config("other"))
    return root


@pytest.fixture
def explicit(repo: Path) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(repo, "--model-control-mode", "explicit", "--load-model", "identity") as proc:
        yield proc


# -- modes ------------------------------------------------------------------------------------------------------


def test_explicit_mode_loads_named_models_then_on_request(explicit: ModelsvcProcess) -> None:
    http = httpclient.InferenceServerClient(explicit.url)
    grpc = grpcclient.InferenceServerClient(grpc_target(explicit))
    rows = index(explicit)
    assert rows[("identity", "1")]["state"] == "READY"
    assert rows[("other", None)] == {"name": "other"}  # in the repository, never asked for: its name alone
    assert http.is_server_ready()  # models nobody asked for do not count
    assert not http.is_model_ready("other")
    with pytest.raises(InferenceServerException, match="unknown model"):
        infer(http, "other")

    http.load_model("other")
    assert http.is_model_ready("other")
    np.testing.assert_array_equal(infer(http, "other"), ROW)

    grpc.unload_model("identity")
    assert not grpc.is_model_ready("identity")
    assert index(explicit)[("identity", "1")] == {
        "name": "identity",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    with pytest.raises(InferenceServerException, match="has no available versions"):
        infer(http, "identity")
    assert http.is_server_ready()  # unloaded on purpose: still ready, as in Triton
    ready_rows = httpx.post(f"{explicit.base}/v2/repository/index", json={"ready": True}).json()
    assert ready_rows == [{"name": "other", "version": "1", "state": "READY", "reason": ""}]

    grpc.load_model("identity")
    assert grpc.is_model_ready("identity")
    np.testing.assert_array_equal(infer(http, "identity"), ROW)
    http.unload_model("never-heard-of")  # nothing to unload: no error, as in Triton
    with pytest.raises(InferenceServerException, match="load failed for model 'missing'") as info:
        http.load_model("missing")
    assert "not found in the repository" in str(info.value)
    http.close()
    grpc.close()


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_outside_explicit_mode(repo: Path, mode: str) -> None:
    with ModelsvcProcess(repo, "--model-control-mode", mode) as proc:
        for action in ("load", "unload"):
            r = httpx.post(f"{proc.base}/v2/repository/models/identity/{action}")
            assert r.status_code == 503  # Triton's UNAVAILABLE
            assert r.json() == {"error": NO_LOAD}
        grpc = grpcclient.InferenceServerClient(grpc_target(proc))
        with pytest.raises(InferenceServerException, match=NO_LOAD):
            grpc.load_model("other")
        assert grpc.is_model_ready("identity")
        assert grpc.is_model_ready("other")
        grpc.close()


def test_load_model_star_loads_everything_and_star_must_be_alone(repo: Path) -> None:
    with ModelsvcProcess(repo, "--model-control-mode", "explicit", "--load-model", "*") as proc:
        assert {n for (n, _), r in index(proc).items() if r.get("state") == "READY"} == {"identity", "other"}
    proc = ModelsvcProcess(repo, "--model-control-mode", "explicit", "--load-model", "*", "--load-model", "x")
    assert proc.start().wait_exit() == 2
    assert "--load-model=* must be the only" in proc.log()


# -- overrides --------------------------------------------------------------------------------------------------


def test_config_override_is_what_gets_served(explicit: ModelsvcProcess) -> None:
    http = httpclient.InferenceServerClient(explicit.url)
    assert http.get_model_config("identity")["max_batch_size"] == 8
    http.load_model("identity", config=config_json("identity", max_batch_size=4))
    assert http.get_model_config("identity")["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
        infer(http, "identity", np.ones((6, 16), np.float32))
    http.load_model("identity")  # without an override: the folder's config.pbtxt again
    assert http.get_model_config("identity")["max_batch_size"] == 8
    assert infer(http, "identity", np.ones((6, 16), np.float32)).shape == (6, 16)
    with pytest.raises(InferenceServerException, match="not a model config"):
        http.load_model("identity", config='{"max_batch_size": "lots"}')
    http.close()


def test_file_override_loads_an_onnx_model_sent_as_bytes(explicit: ModelsvcProcess) -> None:
    model = om.identity().SerializeToString()
    http = httpclient.InferenceServerClient(explicit.url)
    http.load_model("fresh", config=config_json("fresh"), files={"file:1/model.onnx": model})
    assert http.is_model_ready("fresh")
    np.testing.assert_array_equal(infer(http, "fresh"), ROW)
    assert index(explicit)[("fresh", "1")]["state"] == "READY"

    grpc = grpcclient.InferenceServerClient(grpc_target(explicit))
    grpc.load_model("fresh_grpc", config=config_json("fresh_grpc"), files={"file:1/model.onnx": model})
    np.testing.assert_array_equal(infer(http, "fresh_grpc"), ROW)
    with pytest.raises(InferenceServerException, match="need the 'config' parameter"):
        grpc.load_model("nope", files={"file:1/model.onnx": model})
    for bad in ("file:../escape/model.onnx", "file:/abs/model.onnx"):
        with pytest.raises(InferenceServerException, match="relative path inside the model folder"):
            http.load_model("nope", config=config_json("nope"), files={bad: model})
    r = httpx.post(
        f"{explicit.base}/v2/repository/models/nope/load",
        json={"parameters": {"config": config_json("nope"), "file:1/model.onnx": "%%% not base64"}},
    )
    assert r.status_code == 400
    assert "base64" in r.json()["error"]
    http.unload_model("fresh")
    assert index(explicit)[("fresh", "1")]["reason"] == "unloaded"
    http.close()
    grpc.close()


# -- reloads ----------------------------------------------------------------------------------------------------


def test_reload_under_load_fails_no_request(explicit: ModelsvcProcess) -> None:
    """Clients infer without pause on four threads (HTTP and gRPC) while the model is reloaded again and again."""
    stop = threading.Event()
    failures: list[str] = []
    done = [0] * 4
    lock = threading.Lock()

    def http_worker(slot: int) -> None:
        client = httpclient.InferenceServerClient(explicit.url, network_timeout=WAIT)
        while not stop.is_set():
            try:
                out = infer(client, "identity")
                assert np.array_equal(out, ROW)
            except Exception as exc:
                with lock:
                    failures.append(f"http: {exc!r}")
            done[slot] += 1
        client.close()

    def grpc_worker(slot: int) -> None:
        client = grpcclient.InferenceServerClient(grpc_target(explicit))
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(ROW)
        while not stop.is_set():
            try:
                out = client.infer("identity", [inp], client_timeout=WAIT).as_numpy("OUTPUT0")
                assert np.array_equal(out, ROW)
            except Exception as exc:
                with lock:
                    failures.append(f"grpc: {exc!r}")
            done[slot] += 1
        client.close()

    threads = [threading.Thread(target=w, args=(i,)) for i, w in enumerate([http_worker, grpc_worker] * 2)]
    for t in threads:
        t.start()
    admin = httpclient.InferenceServerClient(explicit.url)
    try:
        wait_for(lambda: all(done), "every client to get answers")
        for round_ in range(6):
            before = sum(done)
            delay = 100 * (round_ + 1)
            admin.load_model(
                "identity",
                config=config_json("identity", extra={"dynamic_batching": {"max_queue_delay_microseconds": delay}}),
            )
            served = admin.get_model_config("identity")["dynamic_batching"]["max_queue_delay_microseconds"]
            assert served == delay
            wait_for(lambda before=before: sum(done) > before + 20, "requests to go on after the reload")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT)
    assert failures == []
    assert admin.is_server_ready()
    stats = admin.get_inference_statistics("identity")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= sum(done)  # counters go on across reloads
    assert stats["inference_stats"]["fail"]["count"] == 0
    admin.close()


def test_failed_reload_keeps_the_old_version_serving(explicit: ModelsvcProcess, repo: Path) -> None:
    http = httpclient.InferenceServerClient(explicit.url)
    bad = json.loads(config_json("identity"))
    bad["input"][0]["dims"] = [17]  # the ONNX model takes 16
    with pytest.raises(InferenceServerException, match="load failed for model 'identity'") as info:
        http.load_model("identity", config=json.dumps(bad))
    assert "17" in str(info.value)
    assert "(load request)" in str(info.value)
    np.testing.assert_array_equal(infer(http, "identity"), ROW)
    assert http.get_model_config("identity")["input"][0]["dims"] == [16]
    row = index(explicit)[("identity", "1")]
    assert row["state"] == "READY"
    assert "reload failed, the loaded versions still serve" in row["reason"]
    assert "17" in row["reason"]
    assert http.is_server_ready()

    config_path = repo / "identity" / "config.pbtxt"
    config_path.write_text(identity_config("identity").replace("max_batch_size: 8", "max_batch_size: eight"))
    with pytest.raises(InferenceServerException, match=r"config.pbtxt:3:"):
        http.load_model("identity")
    np.testing.assert_array_equal(infer(http, "identity"), ROW)

    config_path.write_text(identity_config("identity", max_batch_size=2))
    http.load_model("identity")
    assert http.get_model_config("identity")["max_batch_size"] == 2
    assert index(explicit)[("identity", "1")]["reason"] == ""
    http.close()


def test_a_model_that_never_loaded_is_unavailable_with_its_reason(repo: Path) -> None:
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nplatform: "onnxruntime_onnx"\n')
    proc = ModelsvcProcess(repo, "--model-control-mode", "explicit", "--exit-on-error", "false").start()
    try:
        proc.wait_ready()
        http = httpclient.InferenceServerClient(proc.url)
        with pytest.raises(InferenceServerException, match="load failed for model 'broken'"):
            http.load_model("broken")
        row = index(proc)[("broken", None)]
        assert row["state"] == "UNAVAILABLE"
        assert "model.onnx" in row["reason"]
        assert not ready_server(proc)  # asked for and failed: not ready, as in Triton
        http.unload_model("broken")
        assert ready_server(proc)
        http.close()
    finally:
        proc.terminate()


# -- ensembles' composing models --------------------------------------------------------------------------------

ENSEMBLE = """name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "first" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "middle" } },
    { model_name: "second" model_version: -1
      input_map { key: "INPUT0" value: "middle" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
"""


@pytest.fixture
def ensemble_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    om.write_model(root, "first", om.identity(), identity_config("first"))
    om.write_model(root, "second", om.identity(), identity_config("second"))
    (root / "pipe" / "1").mkdir(parents=True)
    (root / "pipe" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def states(proc: ModelsvcProcess) -> dict[str, str]:
    return {name: row.get("state", "") for (name, _), row in index(proc).items()}


def test_an_ensemble_loads_its_composing_models_and_unload_dependents_takes_them(ensemble_repo: Path) -> None:
    with ModelsvcProcess(ensemble_repo, "--model-control-mode", "explicit", "--load-model", "pipe") as proc:
        http = httpclient.InferenceServerClient(proc.url)
        assert states(proc) == {"first": "READY", "second": "READY", "pipe": "READY"}
        np.testing.assert_array_equal(infer(http, "pipe"), ROW)

        http.unload_model("pipe", unload_dependents=True)  # both were loaded only for the ensemble
        assert states(proc) == {"first": "UNAVAILABLE", "second": "UNAVAILABLE", "pipe": "UNAVAILABLE"}
        assert http.is_server_ready()

        http.load_model("first")  # on its own account this time
        http.load_model("pipe")  # loads "second" for it
        assert states(proc) == {"first": "READY", "second": "READY", "pipe": "READY"}
        http.unload_model("pipe", unload_dependents=True)
        assert states(proc) == {"first": "READY", "second": "UNAVAILABLE", "pipe": "UNAVAILABLE"}

        http.load_model("pipe")
        http.unload_model("second")  # the ensemble cannot run without it
        row = index(proc)[("pipe", "1")]
        assert row["state"] == "UNAVAILABLE"
        assert "composing model 'second' is not available" in row["reason"]
        with pytest.raises(InferenceServerException, match="no available versions"):
            infer(http, "pipe")
        http.load_model("second")  # and it comes back with it
        assert states(proc)["pipe"] == "READY"
        np.testing.assert_array_equal(infer(http, "pipe"), ROW)
        http.close()


def test_every_model_at_start_loads_ensembles_after_their_composing_models(ensemble_repo: Path) -> None:
    with ModelsvcProcess(ensemble_repo) as proc:
        assert states(proc) == {"first": "READY", "second": "READY", "pipe": "READY"}


# -- polling ----------------------------------------------------------------------------------------------------


@pytest.fixture
def polling(repo: Path) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "1") as proc:
        yield proc


def reason_of(proc: ModelsvcProcess, name: str) -> str:
    return str(index(proc).get((name, None), {}).get("reason", ""))


def test_poll_mode_loads_a_folder_copied_in_slowly_only_once_complete(polling: ModelsvcProcess, repo: Path) -> None:
    http = httpclient.InferenceServerClient(polling.url)
    late = repo / "late"
    late.mkdir()
    (late / "config.pbtxt").write_text(identity_config("late"))
    wait_for(lambda: "no version folder" in reason_of(polling, "late"), "the poll to see the config alone")
    assert not http.is_model_ready("late")

    (late / "1").mkdir()
    wait_for(lambda: "version folder 1/ is empty" in reason_of(polling, "late"), "the poll to see the empty version")
    assert not http.is_model_ready("late")
    assert ready_server(polling)  # a folder still arriving is nobody's failure

    onnx.save(om.identity(), str(late / "1" / "model.onnx"))
    wait_for(lambda: http.is_model_ready("late"), "the complete folder to load")
    np.testing.assert_array_equal(infer(http, "late"), ROW)

    shutil.rmtree(late)
    wait_for(lambda: ("late", "1") not in index(polling), "the removed folder to unload")
    with pytest.raises(InferenceServerException, match="unknown model"):
        infer(http, "late")
    http.close()


def test_poll_mode_reloads_a_changed_config_and_keeps_serving_when_it_is_wrong(
    polling: ModelsvcProcess, repo: Path
) -> None:
    http = httpclient.InferenceServerClient(polling.url)
    config_path = repo / "identity" / "config.pbtxt"
    config_path.write_text(identity_config("identity", max_batch_size=4))
    wait_for(lambda: http.get_model_config("identity")["max_batch_size"] == 4, "the changed config to load")

    config_path.write_text(identity_config("identity", max_batch_size=4, dims="17"))
    wait_for(lambda: "reload failed" in index(polling)[("identity", "1")]["reason"], "the failed reload")
    np.testing.assert_array_equal(infer(http, "identity"), ROW)  # the old version still serves
    assert http.get_model_config("identity")["max_batch_size"] == 4
    assert ready_server(polling)

    (repo / "identity" / "2").mkdir()
    onnx.save(om.identity(), str(repo / "identity" / "2" / "model.onnx"))
    config_path.write_text(identity_config("identity"))  # fixed, and a new version (latest 1 by default)
    wait_for(lambda: http.is_model_ready("identity", "2"), "version 2")
    wait_for(lambda: index(polling)[("identity", "1")]["reason"] == "unloaded", "version 1 to go")
    assert not http.is_model_ready("identity", "1")
    http.close()


def test_poll_mode_takes_an_ensemble_down_with_its_composing_model_and_back(ensemble_repo: Path) -> None:
    with ModelsvcProcess(ensemble_repo, "--model-control-mode", "poll", "--repository-poll-secs", "1") as proc:
        http = httpclient.InferenceServerClient(proc.url)
        shutil.rmtree(ensemble_repo / "second")
        wait_for(lambda: states(proc).get("pipe") == "UNAVAILABLE", "the ensemble to go down")
        assert "second" not in states(proc)
        assert "composing model 'second' is not available" in index(proc)[("pipe", "1")]["reason"]
        om.write_model(ensemble_repo, "second", om.identity(), identity_config("second"))
        wait_for(lambda: states(proc).get("pipe") == "READY", "the ensemble to come back")
        np.testing.assert_array_equal(infer(http, "pipe"), ROW)
        http.close()
