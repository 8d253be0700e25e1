"""Restricted APIs (``--http-restricted-api``, ``--grpc-restricted-protocol``) on a real server, via tritonclient."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.server._restricted import ApiCategory, RestrictedApis, RestrictionError, http_category
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

ADMIN = {"admin-key": "s3cret"}
INFER = {"infer-key": "go"}
# (tritonclient.http adds to the headers dict it is given: each call gets a copy, so that the same test may run again)
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}
ROW = np.ones((1, 16), np.float32)
WAIT = 30.0


@pytest.fixture(scope="module", params=["0", "2"], ids=["one process", "two ingest workers"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    """With ingest workers the workers check inference; every other call they forward is checked by the engine."""
    repo = tmp_path_factory.mktemp("repo")
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "other", om.identity(), identity_config("other"))
    flags = [
        *("--model-control-mode", "explicit", "--load-model", "identity"),
        *("--http-restricted-api", "model-repository,statistics:admin-key=s3cret"),
        *("--http-restricted-api", "inference:Infer-Key=go"),
        *("--grpc-restricted-protocol", "model-repository,model-config:admin-key=s3cret"),
        *("--grpc-restricted-protocol", "inference:infer-key=go"),
    ]
    with ModelsvcProcess(repo, *flags, "--workers", request.param) as proc:
        yield proc


def http_input() -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(ROW)
    return inp


@pytest.mark.integration
def test_http_restricted_apis_need_their_header(server: ModelsvcProcess) -> None:
    r = httpx.post(f"{server.base}/v2/repository/index")
    assert r.status_code == 403
    assert r.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
    assert httpx.post(f"{server.base}/v2/repository/index", headers={"admin-key": "wrong"}).status_code == 403
    assert httpx.post(f"{server.base}/v2/repository/index", headers=ADMIN).status_code == 200
    assert httpx.get(f"{server.base}/v2/models/identity/stats").status_code == 403
    assert httpx.get(f"{server.base}/v2/models/stats", headers=ADMIN).status_code == 200

    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="This API is restricted") as info:
        client.load_model("other", headers=dict(INFER))
    assert info.value.status() == "403"
    client.load_model("other", headers=dict(ADMIN))
    client.unload_model("other", headers=dict(ADMIN))
    # inference (answered by the fast HTTP path) needs its own header, named without case
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        client.infer("identity", [http_input()])
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.infer("identity", [http_input()], headers=dict(ADMIN))
    out = client.infer("identity", [http_input()], headers={"INFER-KEY": "go"}).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, ROW)
    # what is not restricted answers anyone
    assert client.is_server_ready()
    assert client.is_model_ready("identity")
    assert client.get_model_metadata("identity")["name"] == "identity"
    assert client.get_model_config("identity")["max_batch_size"] == 8
    client.close()


@pytest.mark.integration
def test_grpc_restricted_protocols_need_their_metadata(server: ModelsvcProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    message = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    for call in (
        lambda: client.get_model_repository_index(),
        lambda: client.get_model_config("identity"),
        lambda: client.load_model("other"),
        lambda: client.unload_model("other", headers={"admin-key": "s3cret"}),  # HTTP's header name is not enough
    ):
        with pytest.raises(InferenceServerException, match=message) as info:
            call()
        assert str(info.value.status()) == "StatusCode.UNAVAILABLE"
    assert {m.name for m in client.get_model_repository_index(headers=GRPC_ADMIN).models} == {"identity", "other"}
    assert client.get_model_config("identity", headers=GRPC_ADMIN).config.max_batch_size == 8
    client.load_model("other", headers=GRPC_ADMIN)
    client.unload_model("other", headers=GRPC_ADMIN)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(ROW)
    with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-infer-key'"):
        client.infer("identity", [inp], headers=GRPC_ADMIN)
    out = client.infer("identity", [inp], headers={"triton-grpc-protocol-infer-key": "go"}).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, ROW)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: answers.put(error or result))  # refused as a whole, at once
    assert "This protocol is restricted" in str(answers.get(timeout=WAIT))
    client.stop_stream()
    client.start_stream(
        lambda result, error: answers.put(error or result), headers={"triton-grpc-protocol-infer-key": "go"}
    )
    client.async_stream_infer("identity", [inp])
    np.testing.assert_array_equal(answers.get(timeout=WAIT).as_numpy("OUTPUT0"), ROW)
    client.stop_stream()
    # gRPC restricts only what its own flags name: statistics are open here, though HTTP restricts them
    assert client.get_inference_statistics("identity").model_stats[0].name == "identity"
    assert client.is_server_ready()
    client.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("model-reposit:k=v", "unknown restricted api 'model-reposit'"),
        ("health:k=v", "api 'health' can not be specified in multiple config groups"),
        ("health", "must read"),
    ],
)
def test_bad_restriction_flags_stop_the_server(tmp_path: Path, flag: str, message: str) -> None:
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    proc = ModelsvcProcess(tmp_path, "--http-restricted-api", "health,metadata:k1=v1", "--http-restricted-api", flag)
    assert proc.start().wait_exit() == 2
    assert message in proc.log()


def test_parsing_and_categories() -> None:
    rules = RestrictedApis.parse_grpc(["inference,health:Key=a:b=c"])
    assert rules.restricts(ApiCategory.HEALTH)
    assert not rules.restricts(ApiCategory.METADATA)
    assert rules.denied(ApiCategory.INFERENCE, [("triton-grpc-protocol-key", "a:b=c")]) is None
    assert rules.denied(ApiCategory.INFERENCE, [(b"key", b"a:b=c")]) is not None
    assert rules.denied(ApiCategory.METADATA, []) is None
    with pytest.raises(RestrictionError, match="unknown restricted protocol 'nope'"):
        RestrictedApis.parse_grpc(["nope:k=v"])
    assert not RestrictedApis.parse_http([])
    paths = {
        "/v2": ApiCategory.METADATA,
        "/v2/health/ready": ApiCategory.HEALTH,
        "/v2/models/m/versions/2/ready": ApiCategory.HEALTH,
        "/v2/models/m": ApiCategory.METADATA,
        "/v2/models/m/versions/2": ApiCategory.METADATA,
        "/v2/models/m/config": ApiCategory.MODEL_CONFIG,
        "/v2/models/m/versions/2/infer": ApiCategory.INFERENCE,
        "/v2/models/stats": ApiCategory.STATISTICS,
        "/v2/models/m/versions/2/stats": ApiCategory.STATISTICS,
        "/v2/repository/index": ApiCategory.MODEL_REPOSITORY,
        "/v2/repository/models/m/load": ApiCategory.MODEL_REPOSITORY,
        "/v2/systemsharedmemory/status": ApiCategory.SHARED_MEMORY,
        "/v2/trace/setting": ApiCategory.TRACE,
        "/v2/models/m/trace/setting": ApiCategory.TRACE,
        "/v2/logging": ApiCategory.LOGGING,
        "/metrics": None,
    }
    assert {p: http_category(p) for p in paths} == paths
