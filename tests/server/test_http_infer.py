"""The v2 HTTP endpoints, driven by tritonclient (the outside reference client) against a real server."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.conftest import DTYPES, infer_input

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "modelsvc"
    assert "binary_tensor_data" in meta["extensions"]
    assert "statistics" in meta["extensions"]


def test_model_metadata_and_config(client):
    meta = client.get_model_metadata("add_sub")
    assert meta["name"] == "add_sub"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ]
    config = client.get_model_config("identity")
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [16]  # int64 as numbers, as Triton serves them
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert "dynamic_batching" in config
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", "1")
    assert not client.is_model_ready("identity", "7")
    assert not client.is_model_ready("nope")


def test_autocompleted_config_is_served(client):
    config = client.get_model_config("auto_add_sub")
    assert config["max_batch_size"] == 4
    assert {i["name"] for i in config["input"]} == {"INPUT0", "INPUT1"}
    assert config["input"][0]["dims"] == [16]
    assert "dynamic_batching" in config
    a = np.ones((2, 16), np.float32)
    result = client.infer("auto_add_sub", [infer_input("INPUT0", a), infer_input("INPUT1", a)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_binary_and_json(client, binary):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer(
        "add_sub",
        [infer_input("INPUT0", a, binary), infer_input("INPUT1", b, binary)],
        outputs=outputs,
        request_id="req-7",
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"


def test_requested_output_subset(client):
    a = np.ones((1, 16), np.float32)
    result = client.infer(
        "add_sub",
        [infer_input("INPUT0", a), infer_input("INPUT1", a)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
    )
    assert result.as_numpy("OUTPUT0") is None
    assert np.array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def _sample(dtype: str) -> np.ndarray:
    if dtype == "BYTES":
        return np.array([[b"a", b"\x00bin", "naïve".encode(), b""]] * 2, dtype=np.object_)
    if dtype == "BOOL":
        return np.array([[True, False, True, True]] * 2)
    np_dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype) or np.dtype(dtype.lower())
    return (np.arange(8).reshape(2, 4) + 3).astype(np_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(client, dtype, binary):
    if dtype == "BYTES" and not binary:
        data = np.array([["a", "b", "naïve", ""]] * 2, dtype=np.object_)
    else:
        data = _sample(dtype)
    inp = httpclient.InferInput("INPUT0", list(data.shape), dtype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{dtype.lower()}", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    if dtype == "BYTES":
        # tritonclient hands back bytes from binary outputs and str from JSON ones
        assert got.tolist() == data.tolist()
    else:
        assert got.dtype == data.dtype
        assert np.array_equal(got, data)


def test_bf16_round_trips_through_tritonclient(client):
    data = np.array([[1.5, -2.0, 0.0078125, 2.0**100]], dtype=np.float32)  # all exact in bfloat16
    inp = httpclient.InferInput("INPUT0", [1, 4], "BF16")
    inp.set_data_from_numpy(data, binary_data=True)
    result = client.infer("identity_bf16", [inp])
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)
    assert result.get_output("OUTPUT0")["datatype"] == "BF16"


def test_non_utf8_bytes_for_an_onnx_string_tensor_is_a_clear_400(client):
    data = np.array([[b"\xff\xfe", b"a", b"b", b"c"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 4], "BYTES")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException, match="UTF-8") as info:
        client.infer("identity_bytes", [inp])
    assert info.value.status() == "400"


def test_token_model_with_variable_sequence_lengths(client):
    for seq in (3, 17, 64):
        ids = np.random.default_rng(seq).integers(0, 1000, (2, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        result = client.infer("token", [infer_input("input_ids", ids), infer_input("attention_mask", mask)])
        assert result.as_numpy("logits").shape == (2, 4)


def test_model_without_batching_takes_exact_dims(client):
    a = np.arange(16, dtype=np.float32)
    assert np.array_equal(client.infer("nobatch", [infer_input("INPUT0", a)]).as_numpy("OUTPUT0"), a)
    with pytest.raises(InferenceServerException, match=r"Expected \[16\], got \[1, 16\]"):
        client.infer("nobatch", [infer_input("INPUT0", a.reshape(1, 16))])


def test_version_policy_latest_two(client):
    meta = client.get_model_metadata("versioned")
    assert meta["versions"] == ["2", "3"]
    a = np.ones((1, 16), np.float32)
    assert client.infer("versioned", [infer_input("INPUT0", a)]).get_response()["model_version"] == "3"
    assert (
        client.infer("versioned", [infer_input("INPUT0", a)], model_version="2").get_response()["model_version"] == "2"
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("versioned", [infer_input("INPUT0", a)], model_version="1")
    assert info.value.status() == "404"


async def test_concurrent_requests_are_batched_by_aio_client(server):
    async with aioclient.InferenceServerClient(server.url) as c:
        before = (await c.get_inference_statistics("token"))["model_stats"][0]
        ids = np.ones((1, 32), np.int64)

        async def one(i: int):
            inputs = [
                aioclient.InferInput("input_ids", [1, 32], "INT64"),
                aioclient.InferInput("attention_mask", [1, 32], "INT64"),
            ]
            inputs[0].set_data_from_numpy(ids * i)
            inputs[1].set_data_from_numpy(np.ones_like(ids))
            return (await c.infer("token", inputs)).as_numpy("logits")

        results = await asyncio.gather(*(one(i) for i in range(48)))
        after = (await c.get_inference_statistics("token"))["model_stats"][0]
    assert all(r.shape == (1, 4) for r in results)
    # each request's answer is its own: different inputs, different logits
    assert len({r.tobytes() for r in results}) > 40
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 48
    assert executions < inferences  # the dynamic batcher merged requests


def test_statistics_json(client):
    a = np.ones((2, 16), np.float32)
    client.infer("identity", [infer_input("INPUT0", a)])
    stats = client.get_inference_statistics("identity")["model_stats"]
    assert [s["name"] for s in stats] == ["identity"]
    s = stats[0]
    assert s["version"] == "1"
    assert s["inference_count"] >= 2
    assert s["execution_count"] >= 1
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(s["inference_stats"][key]) == {"count", "ns"}
    assert s["inference_stats"]["success"]["count"] >= 1
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert any(b["batch_size"] == 2 for b in s["batch_stats"])
    assert s["last_inference"] > 0
    everything = client.get_inference_statistics()["model_stats"]
    assert {"identity", "add_sub", "token"} <= {m["name"] for m in everything}
    assert client.get_inference_statistics("versioned", "2")["model_stats"][0]["version"] == "2"


def test_repository_index(client):
    index = client.get_model_repository_index()
    rows = {(r["name"], r.get("version")): r["state"] for r in index}
    assert rows[("identity", "1")] == "READY"
    assert rows[("versioned", "3")] == "READY"
    assert ("versioned", "1") not in rows


def test_metrics_use_tritons_bare_names(client, server):
    a = np.ones((1, 16), np.float32)
    client.infer("identity", [infer_input("INPUT0", a)])
    with pytest.raises(InferenceServerException):
        client.infer("identity", [infer_input("INPUT0", np.ones((1, 3), np.float32))])
    text = httpx.get(server.metrics_url).text
    for name in (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ):
        assert f"# TYPE {name} counter" in text
        assert f'{name}{{model="identity",version="1"}} ' in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert "nv_inference_request_success_total" not in text
    assert "process_cpu_seconds_total" in text
    assert "process_resident_memory_bytes" in text
    assert 'modelsvc_model_execution_provider{model="identity",version="1",provider="CPUExecutionProvider"} 1.0' in text

    def value(name: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(f'{name}{{model="identity",version="1"}}'))
        return float(line.split()[-1])

    stats = client.get_inference_statistics("identity")["model_stats"][0]
    assert value("nv_inference_request_success") >= 1
    assert value("nv_inference_request_failure") >= 1
    assert value("nv_inference_exec_count") <= stats["execution_count"]
