"""The response cache: ``--cache-config local,size=BYTES`` on the server, ``response_cache { enable: true }`` per model.

Tests against a real server with tritonclient (HTTP and gRPC) read the statistics and metrics a hit and a
miss leave; the LRU store and the flag's parser are tested directly.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from modelsvc.engine._cache import (
    ENTRY_OVERHEAD,
    TENSOR_OVERHEAD,
    CacheConfigError,
    CacheSettings,
    ResponseCache,
    parse_cache_config,
    request_key,
)
from modelsvc.protocol import InferRequest, Tensor
from modelsvc.scheduler import ModelStats
from modelsvc.tools import onnx_models as om
from tests._ensembles import ensemble, step, write_ensemble
from tests._server import ROOT, ModelsvcProcess
from tests.conftest import identity_config, infer_input

pytestmark = pytest.mark.integration

CACHED = "dynamic_batching { }\nresponse_cache { enable: true }"
ADD_SUB = """name: "cached_add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
response_cache { enable: true }
"""


def build_repository(repo: Path) -> Path:
    om.write_model(repo, "cached", om.identity(), identity_config("cached", extra=CACHED))
    om.write_model(repo, "uncached", om.identity(), identity_config("uncached"))
    om.write_model(
        repo,
        "cached_bytes",
        om.identity("BYTES", ["batch", 4]),
        identity_config("cached_bytes", "BYTES", extra=CACHED, dims="4"),
    )
    om.write_model(repo, "cached_add_sub", om.add_sub(), ADD_SUB)
    om.write_model(repo, "plain", om.identity(), identity_config("plain"))
    write_ensemble(
        repo,
        "cached_pipe",
        ensemble(
            "cached_pipe",
            "IN:FP32:16",
            "OUT:FP32:16",
            ",\n".join(
                [step("plain", {"INPUT0": "IN"}, {"OUTPUT0": "x"}), step("plain", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
            ),
            extra="response_cache { enable: true }",
        ),
    )
    return repo


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("cache_repo"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(repository, "--cache-config", "local,size=1048576") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def counts(server: ModelsvcProcess, model: str) -> dict[str, int]:
    s = server.model_stats(model)
    inference = s["inference_stats"]
    return {
        "hit": inference["cache_hit"]["count"],
        "miss": inference["cache_miss"]["count"],
        "success": inference["success"]["count"],
        "queue": inference["queue"]["count"],
        "inferences": s["inference_count"],
        "executions": s["execution_count"],
    }


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in before}


def metric(text: str, name: str, model: str | None = None) -> float:
    labels = f'{{model="{model}",version="1"}}' if model else ""
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name}{labels} not in the metrics"
    return float(found.group(1))


def fresh(seed: int, rows: int = 1) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random((rows, 16), dtype=np.float32)


# --- a real server ----------------------------------------------------------------------------------------


def test_the_same_request_is_answered_from_the_cache(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    before = counts(server, "cached")
    x = fresh(1, rows=2)
    first = client.infer("cached", [infer_input("INPUT0", x)], request_id="one")
    second = client.infer("cached", [infer_input("INPUT0", x)], request_id="two")
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), x)
    assert second.get_response()["id"] == "two"
    assert grown(before, counts(server, "cached")) == {
        "hit": 1,
        "miss": 1,
        "success": 2,
        "queue": 2,
        "inferences": 2,  # the one run, batch of 2: the hit ran nothing
        "executions": 1,
    }
    text = httpx.get(server.metrics_url, timeout=10).text
    assert metric(text, "nv_cache_num_hits_per_model", "cached") >= 1
    assert metric(text, "nv_cache_num_misses_per_model", "cached") >= 1
    assert 'nv_cache_num_hits_per_model{model="uncached"' not in text  # as Triton: only models that cache
    assert metric(text, "nv_cache_num_entries") >= 1
    assert 0 < metric(text, "nv_cache_util") < 1
    assert metric(text, "nv_cache_num_lookups") >= 2
    assert "# TYPE nv_cache_num_hits_per_model counter" in text


def test_anything_that_changes_the_answer_misses(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    a, b = fresh(2), fresh(3)
    before = counts(server, "cached_add_sub")
    both = [infer_input("INPUT0", a), infer_input("INPUT1", b)]
    client.infer("cached_add_sub", both)
    client.infer("cached_add_sub", [infer_input("INPUT1", b), infer_input("INPUT0", a)])  # order: same request
    client.infer("cached_add_sub", both, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])  # other outputs
    client.infer("cached_add_sub", [infer_input("INPUT0", b), infer_input("INPUT1", a)])  # other data
    client.infer("cached_add_sub", both, parameters={"flavour": "sour"})  # a parameter a model could read
    client.infer("cached_add_sub", both, priority=0, timeout=5_000_000)  # scheduling only: still the same
    after = grown(before, counts(server, "cached_add_sub"))
    assert (after["hit"], after["miss"], after["success"]) == (2, 4, 6)
    only = client.infer("cached_add_sub", both, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None
    np.testing.assert_allclose(only.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_bytes_answers_come_back_whole_over_http_and_grpc(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    words = np.array([[b"cache", b"", "é".encode(), b"\x00bin"]], dtype=np.object_)
    before = counts(server, "cached_bytes")
    first = client.infer("cached_bytes", [infer_input("INPUT0", words)]).as_numpy("OUTPUT0")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 4], "BYTES")
        inp.set_data_from_numpy(words)
        second = grpc.infer("cached_bytes", [inp]).as_numpy("OUTPUT0")
    finally:
        grpc.close()
    assert first.tolist() == second.tolist() == words.tolist()
    assert grown(before, counts(server, "cached_bytes"))["hit"] == 1


def test_a_model_without_response_cache_is_never_cached(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    before = counts(server, "uncached")
    x = fresh(4)
    for _ in range(2):
        client.infer("uncached", [infer_input("INPUT0", x)])
    assert grown(before, counts(server, "uncached")) == {
        "hit": 0,
        "miss": 0,
        "success": 2,
        "queue": 2,
        "inferences": 2,
        "executions": 2,
    }


def test_an_ensemble_s_answer_is_cached_at_the_top(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    x = fresh(5)
    composing = counts(server, "plain")
    before = counts(server, "cached_pipe")
    for _ in range(3):
        np.testing.assert_array_equal(client.infer("cached_pipe", [infer_input("IN", x)]).as_numpy("OUT"), x)
    assert grown(before, counts(server, "cached_pipe"))["hit"] == 2
    assert grown(composing, counts(server, "plain"))["success"] == 2  # two steps, run once


def test_without_cache_config_a_model_that_enables_caching_runs_uncached(repository: Path) -> None:
    with ModelsvcProcess(repository) as server:
        x = fresh(6)
        with httpclient.InferenceServerClient(server.url) as client:
            for _ in range(2):
                client.infer("cached", [infer_input("INPUT0", x)])
        seen = counts(server, "cached")
        assert (seen["hit"], seen["miss"], seen["executions"]) == (0, 0, 2)
        assert "nv_cache" not in httpx.get(server.metrics_url, timeout=10).text
    assert (
        "model 'cached' version 1 enables response_cache, but the server has no cache (start it with "
        "--cache-config local,size=BYTES): it runs uncached" in server.log()
    )


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("redis,host=localhost", "cache 'redis' is not available; modelsvc has the 'local' cache"),
        ("local,size=big", "size must be a whole number of bytes, got 'big'"),
        ("local", "--cache-config takes <cache>,<key>=<value>"),
    ],
)
def test_a_bad_cache_config_stops_the_server_at_once(tmp_path: Path, flag: str, words: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "modelsvc", "serve", "--model-repository", str(tmp_path), "--cache-config", flag],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert words in done.stderr


# --- the parts --------------------------------------------------------------------------------------------


def test_cache_config_takes_triton_s_syntax() -> None:
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1048576"]) == CacheSettings("local", 1048576)
    assert parse_cache_config(["local,size=1", "local,size=2"]) == CacheSettings("local", 2)
    for bad in ("local,size=-1", "local,bytes=10", ",size=1", "local,size"):
        with pytest.raises(CacheConfigError):
            parse_cache_config([bad])
    assert ResponseCache.from_settings(CacheSettings("local", 0)) is None
    assert ResponseCache.from_settings(None) is None


def tensor(name: str, array: np.ndarray[Any, Any], datatype: str = "FP32") -> Tensor:
    return Tensor(name, datatype, array.shape, array)


def test_the_store_is_lru_within_its_byte_budget_and_hands_out_copies() -> None:
    one_entry = ENTRY_OVERHEAD + TENSOR_OVERHEAD + 64  # a [1, 16] FP32 answer
    cache = ResponseCache(capacity=2 * one_entry)
    stats = ModelStats("m", "1")

    def request(seed: int) -> InferRequest:
        return InferRequest([tensor("INPUT0", fresh(seed))])

    keys = []
    for seed in range(3):
        key, hit = cache.lookup("m", "1", request(seed), ["OUTPUT0"], stats)
        assert hit is None
        if seed == 2:  # touch the first entry: the second is now the least recently used
            assert cache.lookup("m", "1", request(0), ["OUTPUT0"], stats)[1] is not None
        cache.insert(key, [tensor("OUTPUT0", fresh(seed))], stats)
        keys.append(key)
    assert (cache.entries, cache.used, cache.evictions) == (2, 2 * one_entry, 1)
    assert cache.lookup("m", "1", request(1), ["OUTPUT0"], stats)[1] is None  # evicted
    key, hit = cache.lookup("m", "1", request(2), ["OUTPUT0"], stats)
    assert hit is not None
    hit[0].data[0, 0] = 99.0  # the caller's copy
    again = cache.lookup("m", "1", request(2), ["OUTPUT0"], stats)[1]
    assert again is not None
    np.testing.assert_array_equal(again[0].data, fresh(2))
    big = np.zeros((1, 4096), np.float32)
    cache.insert(b"big", [tensor("OUTPUT0", big)], stats)  # larger than the whole budget: not stored
    assert cache.entries == 2
    assert (stats.cache_hit.count, stats.cache_miss.count) == (3, 4)
    assert cache.utilization == 1.0


def test_the_key_sees_every_input_byte_and_shape_but_not_input_order() -> None:
    a, b = fresh(7), fresh(8)
    key = request_key("m", "1", InferRequest([tensor("A", a), tensor("B", b)]), ["Y"])
    assert key == request_key("m", "1", InferRequest([tensor("B", b), tensor("A", a)]), ["Y"])
    changed = a.copy()
    changed[0, 15] = np.nextafter(changed[0, 15], np.float32(2))  # one bit
    others = [
        request_key("m", "1", InferRequest([tensor("A", changed), tensor("B", b)]), ["Y"]),
        request_key("m", "2", InferRequest([tensor("A", a), tensor("B", b)]), ["Y"]),
        request_key("n", "1", InferRequest([tensor("A", a), tensor("B", b)]), ["Y"]),
        request_key("m", "1", InferRequest([tensor("A", a), tensor("B", b)]), ["Y", "Z"]),
        request_key("m", "1", InferRequest([tensor("A", a.reshape(16, 1)), tensor("B", b)]), ["Y"]),
        request_key("m", "1", InferRequest([tensor("A", a.view(np.int32), "INT32"), tensor("B", b)]), ["Y"]),
    ]
    assert len({key, *others}) == 1 + len(others)
    words = np.array([b"ab", b"c"], dtype=np.object_)
    split = np.array([b"a", b"bc"], dtype=np.object_)
    assert request_key("m", "1", InferRequest([tensor("S", words, "BYTES")]), ["Y"]) != request_key(
        "m", "1", InferRequest([tensor("S", split, "BYTES")]), ["Y"]
    )
