"""Regression tests from the review of model management, restricted APIs and the response cache, on a real
``modelsvc serve``: stale cached answers after reloads (of a model, and of an ensemble's composing model),
restricted metadata of models named like routes, load requests with bad overrides. Each failed before its fix."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from modelsvc.tools import onnx_models as om
from tests._ensembles import ensemble, step, write_ensemble
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

ROW = np.arange(16, dtype=np.float32).reshape(1, 16)
CACHED = "dynamic_batching { }\nresponse_cache { enable: true }"


def doubling() -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0 = 2 * INPUT0, FP32 [batch, 16]: the same signature as om.identity(), another answer."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"])],
        "doubling",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
    )
    return om._model(graph)


def infer(client: httpclient.InferenceServerClient, model: str, inp: str = "INPUT0", out: str = "OUTPUT0") -> Any:
    tensor = httpclient.InferInput(inp, [1, 16], "FP32")
    tensor.set_data_from_numpy(ROW)
    return client.infer(model, [tensor]).as_numpy(out)


# --- response cache across reloads -------------------------------------------------------------------------


@pytest.fixture
def cache_server(tmp_path: Path) -> Iterator[ModelsvcProcess]:
    om.write_model(tmp_path, "cached", om.identity(), identity_config("cached", extra=CACHED))
    om.write_model(tmp_path, "plain", om.identity(), identity_config("plain"))
    write_ensemble(
        tmp_path,
        "pipe",
        ensemble(
            "pipe",
            "IN:FP32:16",
            "OUT:FP32:16",
            step("plain", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
            extra="response_cache { enable: true }",
        ),
    )
    flags = ("--model-control-mode", "explicit", "--load-model", "*", "--cache-config", "local,size=1048576")
    with ModelsvcProcess(tmp_path, *flags) as proc:
        yield proc


def test_reloading_a_cached_model_with_a_new_file_does_not_serve_the_old_answer(
    cache_server: ModelsvcProcess,
) -> None:
    """At HEAD the cache key is (model, version label, inputs): a reload of version 1 with another model file
    keeps answering from the cache what the old file computed."""
    client = httpclient.InferenceServerClient(cache_server.url)
    np.testing.assert_array_equal(infer(client, "cached"), ROW)  # a miss: stored
    onnx.save(doubling(), str(cache_server.repository / "cached" / "1" / "model.onnx"))
    client.load_model("cached")
    np.testing.assert_array_equal(infer(client, "cached"), 2 * ROW)


def test_reloading_a_composing_model_does_not_leave_the_ensemble_s_cached_answer_stale(
    cache_server: ModelsvcProcess,
) -> None:
    """The ensemble caches its answer under its own name and version (and, with the build-number fix, its own
    build): reloading a composing model with another file changes what the pipeline computes, but the
    ensemble, which is not rebuilt, keeps answering from the cache."""
    client = httpclient.InferenceServerClient(cache_server.url)
    np.testing.assert_array_equal(infer(client, "pipe", "IN", "OUT"), ROW)  # a miss: stored
    onnx.save(doubling(), str(cache_server.repository / "plain" / "1" / "model.onnx"))
    client.load_model("plain")
    np.testing.assert_array_equal(infer(client, "plain"), 2 * ROW)  # the composing model computes anew
    np.testing.assert_array_equal(infer(client, "pipe", "IN", "OUT"), 2 * ROW)


# --- restricted APIs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["infer", "generate"])
def test_metadata_of_a_model_named_like_an_inference_route_stays_restricted(tmp_path: Path, model: str) -> None:
    """``http_category`` files every ``/v2/models/<x>`` path whose last part is ``infer``/``generate`` under
    INFERENCE, and ``check_restricted`` lets INFERENCE through (InferEndpoint checks it, but only on POST
    .../infer): GET /v2/models/infer is model metadata of the model 'infer', served without the header."""
    om.write_model(tmp_path, model, om.identity(), identity_config(model))
    with ModelsvcProcess(tmp_path, "--http-restricted-api", "metadata,model-config:admin-key=s3cret") as proc:
        assert httpx.get(f"{proc.base}/v2/models/identity_missing").status_code == 403  # the flag works
        r = httpx.get(f"{proc.base}/v2/models/{model}")
        assert r.status_code == 403, r.text


def test_metadata_of_a_model_named_ready_or_config_stays_restricted(tmp_path: Path) -> None:
    """GET /v2/models/ready is the metadata of the model 'ready' but is filed under HEALTH; with only metadata
    restricted it is served without the header (likewise /v2/models/config under MODEL_CONFIG)."""
    for name in ("ready", "config"):
        om.write_model(tmp_path, name, om.identity(), identity_config(name))
    with ModelsvcProcess(tmp_path, "--http-restricted-api", "metadata:admin-key=s3cret") as proc:
        for name in ("ready", "config"):
            r = httpx.get(f"{proc.base}/v2/models/{name}")
            assert r.status_code == 403, (name, r.status_code, r.text)


# --- load requests: errors in what the caller sent are 400, not 500 ------------------------------------------


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[ModelsvcProcess]:
    om.write_model(tmp_path, "plain", om.identity(), identity_config("plain"))
    with ModelsvcProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "plain") as proc:
        yield proc


def config_json(name: str) -> str:
    tensor = {"data_type": "TYPE_FP32", "dims": [16]}
    return json.dumps(
        {
            "name": name,
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", **tensor}],
            "output": [{"name": "OUTPUT0", **tensor}],
        }
    )


@pytest.mark.parametrize("config", ["123", "null", "true"])
def test_a_config_override_that_is_not_a_json_object_is_invalid_argument(
    explicit: ModelsvcProcess, config: str
) -> None:
    """json_format.Parse raises TypeError (not ParseError) for a JSON scalar; _write_override only catches
    ParseError, so the caller's mistake becomes a 500 "internal server error"."""
    r = httpx.post(f"{explicit.base}/v2/repository/models/plain/load", json={"parameters": {"config": config}})
    assert r.status_code == 400, r.text
    assert "config" in r.json()["error"]
    assert httpx.get(f"{explicit.base}/v2/models/plain/ready").status_code == 200  # still serving


def test_file_overrides_whose_paths_collide_are_invalid_argument(explicit: ModelsvcProcess) -> None:
    """'file:1/model.onnx' and 'file:1/model.onnx/x' cannot both be files: writing them raises an OSError in
    _write_override that nobody turns into InvalidArgument, so the answer is a 500."""
    data = base64.b64encode(om.identity().SerializeToString()).decode()
    params = {"config": config_json("plain"), "file:1/model.onnx": data, "file:1/model.onnx/x": data}
    r = httpx.post(f"{explicit.base}/v2/repository/models/plain/load", json={"parameters": params})
    assert r.status_code == 400, r.text
    assert httpx.get(f"{explicit.base}/v2/models/plain/ready").status_code == 200
