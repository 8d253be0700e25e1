"""Ensembles (``platform: "ensemble"``): the step graph, its checks at load, and requests through a real server.

The pipelines here prove their concurrency without clocks: a composing model that only runs once two
requests are queued (``preferred_batch_size: [2]`` and a minute's batch delay) answers only if two steps
reach it together, so a test that gets its answer has shown that the steps overlapped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelsvc.backends import ModelConfig
from modelsvc.engine._ensemble import EnsembleScheduler
from modelsvc.protocol import InferRequest, InvalidArgument, Tensor
from modelsvc.repository import ConfigError, EnsembleConfigError, ModelRepository, plan_ensemble
from modelsvc.server import DataPlane, ModelManager
from modelsvc.tools import onnx_models as om
from tests._ensembles import ensemble, step, write_ensemble
from tests._server import ModelsvcProcess
from tests.conftest import identity_config, infer_input

pytestmark = pytest.mark.integration

PAIR = "dynamic_batching { max_queue_delay_microseconds: 60000000 preferred_batch_size: [ 2 ] }"
"""Runs a batch only once two requests wait (or after a minute): an answer proves two arrived together."""
SLOW = """dynamic_batching {
  max_queue_delay_microseconds: 60000000
  default_queue_policy { allow_timeout_override: true }
}"""


def pipe_config() -> str:
    """A + B and A - B, the difference through identity again: three steps, two models, versions -1 and 1."""
    return ensemble(
        "pipe",
        "A:FP32:16 B:FP32:16",
        "SUM:FP32:16 DIFF:FP32:16",
        ",\n".join(
            [
                step("identity", {"INPUT0": "A"}, {"OUTPUT0": "a"}),
                step("add_sub", {"INPUT0": "a", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "d"}, version=1),
                step("identity", {"INPUT0": "d"}, {"OUTPUT0": "DIFF"}),
            ]
        ),
    )


# --- python models for the text pipeline: written as for Triton's python backend -------------------------

TOKENIZE_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


def token_id(word):
    return sum(word.encode()) % 997 + 1


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = [t[0].decode("utf-8") for t in pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()]
            rows = [[token_id(w) for w in text.split()] for text in texts]
            if not all(rows):
                error = pb_utils.TritonError("TEXT holds an empty text", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            width = max(len(r) for r in rows)
            ids = np.zeros((len(rows), width), np.int64)
            mask = np.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = row
                mask[i, : len(row)] = 1
            outputs = [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

TOKENIZE_CONFIG = """name: "tokenize"
backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
         { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""

POSTPROCESS_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = ["negative", "neutral", "positive", "mixed"]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            best = logits.argmax(axis=1)
            labels = np.array([[LABELS[i].encode()] for i in best], dtype=np.object_)
            scores = logits.max(axis=1, keepdims=True).astype(np.float32)
            outputs = [pb_utils.Tensor("LABEL", labels), pb_utils.Tensor("SCORE", scores)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

POSTPROCESS_CONFIG = """name: "postprocess"
backend: "python"
max_batch_size: 8
input [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }, { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

TOKEN_CONFIG = """name: "token"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
"""


ADD_SUB_CONFIG = """name: "add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
"""


def write_python_model(repo: Path, name: str, model_py: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)


def build_repository(repo: Path) -> Path:
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "add_sub", om.add_sub(), ADD_SUB_CONFIG)
    om.write_model(repo, "pair", om.identity(), identity_config("pair", extra=PAIR))
    om.write_model(repo, "slow", om.identity(), identity_config("slow", extra=SLOW))
    write_ensemble(repo, "pipe", pipe_config())
    # identity, then pair: two requests meet at pair only if one can pass identity while the other waits there
    write_ensemble(
        repo,
        "chain",
        ensemble(
            "chain",
            "IN:FP32:16",
            "OUT:FP32:16",
            ",\n".join(
                [
                    step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
                    step("pair", {"INPUT0": "x"}, {"OUTPUT0": "OUT"}),
                ]
            ),
        ),
    )
    # two independent steps of one request, both at pair: they finish only if they run at the same time
    write_ensemble(
        repo,
        "fork",
        ensemble(
            "fork",
            "L:FP32:16 R:FP32:16",
            "LO:FP32:16 RO:FP32:16",
            ",\n".join(
                [step("pair", {"INPUT0": "L"}, {"OUTPUT0": "LO"}), step("pair", {"INPUT0": "R"}, {"OUTPUT0": "RO"})]
            ),
        ),
    )
    # a variable-length ensemble input that identity (16 wide) refuses at run time
    write_ensemble(
        repo,
        "loose",
        ensemble("loose", "IN:FP32:-1", "OUT:FP32:16", step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
    )
    write_ensemble(
        repo,
        "patient",
        ensemble("patient", "IN:FP32:16", "OUT:FP32:16", step("slow", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
    )
    # an ensemble whose step is an ensemble
    write_ensemble(
        repo,
        "outer",
        ensemble(
            "outer",
            "P:FP32:16 Q:FP32:16",
            "S:FP32:16",
            step("pipe", {"A": "P", "B": "Q"}, {"SUM": "S"}),
        ),
    )
    # the text pipeline: python tokenizer -> ONNX model -> python postprocessor, BYTES in and out
    write_python_model(repo, "tokenize", TOKENIZE_PY, TOKENIZE_CONFIG)
    om.write_model(repo, "token", om.token_classifier(), TOKEN_CONFIG)
    write_python_model(repo, "postprocess", POSTPROCESS_PY, POSTPROCESS_CONFIG)
    write_ensemble(
        repo,
        "classify",
        ensemble(
            "classify",
            "TEXT:STRING:1",
            "LABEL:STRING:1 SCORE:FP32:1",
            ",\n".join(
                [
                    step("tokenize", {"TEXT": "TEXT"}, {"input_ids": "ids", "attention_mask": "mask"}),
                    step("token", {"input_ids": "ids", "attention_mask": "mask"}, {"logits": "logits"}),
                    step("postprocess", {"logits": "logits"}, {"LABEL": "LABEL", "SCORE": "SCORE"}),
                ]
            ),
        ),
    )
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(build_repository(tmp_path_factory.mktemp("ensembles"))) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, concurrency=4)
    yield c
    c.close()


def rows(n: int = 1, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random((n, 16), dtype=np.float32)


# --- through a real server, with tritonclient --------------------------------------------------------


def test_a_three_step_ensemble_answers_like_its_models(client: httpclient.InferenceServerClient) -> None:
    a, b = rows(2, 1), rows(2, 2)
    result = client.infer("pipe", [infer_input("A", a), infer_input("B", b)])
    np.testing.assert_allclose(result.as_numpy("SUM"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("DIFF"), a - b, rtol=1e-6)
    only = client.infer(
        "pipe", [infer_input("A", a), infer_input("B", b)], outputs=[httpclient.InferRequestedOutput("SUM")]
    )
    assert only.as_numpy("DIFF") is None
    np.testing.assert_allclose(only.as_numpy("SUM"), a + b, rtol=1e-6)


def test_an_ensemble_runs_an_ensemble(client: httpclient.InferenceServerClient) -> None:
    p, q = rows(1, 3), rows(1, 4)
    result = client.infer("outer", [infer_input("P", p), infer_input("Q", q)])
    np.testing.assert_allclose(result.as_numpy("S"), p + q, rtol=1e-6)


def test_metadata_and_config_are_triton_s(client: httpclient.InferenceServerClient, server: ModelsvcProcess) -> None:
    meta = client.get_model_metadata("pipe")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["A", "B"]
    assert meta["inputs"][0]["shape"] == [-1, 16]
    config = client.get_model_config("pipe")
    assert config["platform"] == "ensemble"
    assert config.get("backend", "") == ""  # an ensemble has no backend
    assert "instance_group" not in config or config["instance_group"] == []
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["identity", "add_sub", "identity"]
    assert [s["model_version"] for s in steps] == [-1, 1, -1]
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["pipe"]["state"] == "READY"


def test_steps_of_concurrent_requests_batch_together_at_a_composing_model(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    """Two requests to chain meet at pair (which runs only with two queued): while one waits at pair the
    other passes identity, and pair runs both in one batch."""
    before = server.model_stats("pair")
    inputs = [rows(1, seed) for seed in (10, 11)]
    pending = [client.async_infer("chain", [infer_input("IN", x)]) for x in inputs]
    answers = [p.get_result().as_numpy("OUT") for p in pending]
    for sent, got in zip(inputs, answers, strict=True):
        np.testing.assert_array_equal(got, sent)
    after = server.model_stats("pair")
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["execution_count"] - before["execution_count"] == 1
    chain = server.model_stats("chain")
    assert chain["inference_stats"]["success"]["count"] >= 2


def test_independent_steps_of_one_request_run_at_the_same_time(client: httpclient.InferenceServerClient) -> None:
    left, right = rows(1, 20), rows(1, 21)
    result = client.infer("fork", [infer_input("L", left), infer_input("R", right)])
    np.testing.assert_array_equal(result.as_numpy("LO"), left)
    np.testing.assert_array_equal(result.as_numpy("RO"), right)


def test_statistics_per_ensemble_and_per_composing_model(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    before = {m: server.model_stats(m) for m in ("pipe", "identity", "add_sub")}
    a = rows(3, 5)
    client.infer("pipe", [infer_input("A", a), infer_input("B", a)])
    after = {m: server.model_stats(m) for m in ("pipe", "identity", "add_sub")}

    def grew(model: str, key: str) -> int:
        if key in ("success", "fail"):
            return int(after[model]["inference_stats"][key]["count"] - before[model]["inference_stats"][key]["count"])
        return int(after[model][key] - before[model][key])

    assert grew("pipe", "success") == 1
    assert grew("pipe", "inference_count") == 3  # the request's batch of 3
    assert grew("identity", "success") == 2  # steps 0 and 2
    assert grew("identity", "inference_count") == 6
    assert grew("add_sub", "success") == 1
    assert grew("add_sub", "inference_count") == 3


def test_a_failing_step_fails_its_request_only_naming_the_step(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    fails_before = server.model_stats("loose")["inference_stats"]["fail"]["count"]
    with pytest.raises(InferenceServerException) as info:
        client.infer("loose", [infer_input("IN", np.ones((1, 17), np.float32))])
    assert info.value.status() == "400"
    message = info.value.message()
    assert "ensemble 'loose' step 0 (model 'identity'): " in message
    assert "unexpected shape for input 'INPUT0'" in message
    assert server.model_stats("loose")["inference_stats"]["fail"]["count"] == fails_before + 1
    good = client.infer("loose", [infer_input("IN", np.ones((1, 16), np.float32))])  # the ensemble still serves
    np.testing.assert_array_equal(good.as_numpy("OUT"), np.ones((1, 16), np.float32))


def test_request_parameters_reach_the_steps(client: httpclient.InferenceServerClient) -> None:
    """slow holds a request for a minute unless its timeout, passed on from the ensemble request, expires first."""
    with pytest.raises(InferenceServerException) as info:
        client.infer("patient", [infer_input("IN", rows())], timeout=100_000)
    assert info.value.status() == "503"
    assert "ensemble 'patient' step 0 (model 'slow'): Request timeout expired" in info.value.message()


def test_python_tokenizer_onnx_model_python_postprocessor_with_bytes(
    client: httpclient.InferenceServerClient,
) -> None:
    texts = np.array([[b"the service was great"], [b"slow and cold food"]], dtype=np.object_)
    result = client.infer("classify", [infer_input("TEXT", texts)])
    labels, scores = result.as_numpy("LABEL"), result.as_numpy("SCORE")
    assert labels.shape == (2, 1)
    assert scores.shape == (2, 1)
    # the same three models called one by one give the same answer
    tokens = client.infer("tokenize", [infer_input("TEXT", texts)])
    ids, mask = tokens.as_numpy("input_ids"), tokens.as_numpy("attention_mask")
    logits = client.infer("token", [infer_input("input_ids", ids), infer_input("attention_mask", mask)]).as_numpy(
        "logits"
    )
    direct = client.infer("postprocess", [infer_input("logits", logits)])
    assert labels.tolist() == direct.as_numpy("LABEL").tolist()
    np.testing.assert_allclose(scores, direct.as_numpy("SCORE"), rtol=1e-6)
    with pytest.raises(InferenceServerException) as info:
        client.infer("classify", [infer_input("TEXT", np.array([[b"   "]], dtype=np.object_))])
    assert info.value.status() == "400"
    assert info.value.message().endswith("ensemble 'classify' step 0 (model 'tokenize'): TEXT holds an empty text")


# --- checks at load ------------------------------------------------------------------------------------


async def load_errors(repo: Path) -> dict[str, str]:
    """Load ``repo`` in-process; each model that failed, with its reason."""
    models = ModelManager(ModelRepository(repo, gpus=()))
    try:
        await models.load_all()
        return {row["name"]: row.get("reason", "") for row in models.index() if row.get("state") != "READY"}
    finally:
        await models.close()


async def test_ensembles_that_do_not_fit_their_composing_models_fail_to_load(tmp_path: Path) -> None:
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    om.write_model(tmp_path, "small", om.identity(), identity_config("small", max_batch_size=2))
    om.write_model(tmp_path, "nobatch", om.identity(dims=[16]), identity_config("nobatch", extra="", max_batch_size=0))
    one = step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})
    cases = {
        "unknown_model": ensemble("unknown_model", "IN:FP32:16", "OUT:FP32:16", one.replace('"identity"', '"nope"')),
        "unknown_version": ensemble(
            "unknown_version", "IN:FP32:16", "OUT:FP32:16", step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, 7)
        ),
        "bad_input": ensemble(
            "bad_input", "IN:FP32:16", "OUT:FP32:16", step("identity", {"WRONG": "IN"}, {"OUTPUT0": "OUT"})
        ),
        "bad_output": ensemble(
            "bad_output", "IN:FP32:16", "OUT:FP32:16", step("identity", {"INPUT0": "IN"}, {"WRONG": "OUT"})
        ),
        "bad_type": ensemble("bad_type", "IN:INT32:16", "OUT:FP32:16", one),
        "bad_dims": ensemble("bad_dims", "IN:FP32:8", "OUT:FP32:16", one),
        "bad_out_type": ensemble("bad_out_type", "IN:FP32:16", "OUT:FP64:16", one),
        "too_big": ensemble(
            "too_big", "IN:FP32:16", "OUT:FP32:16", step("small", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})
        ),
        "no_batching": ensemble(
            "no_batching", "IN:FP32:16", "OUT:FP32:16", step("nobatch", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})
        ),
    }
    for name, config in cases.items():
        write_ensemble(tmp_path, name, config)
    errors = await load_errors(tmp_path)
    assert set(errors) - {"nope"} == set(cases)  # nope: tried as a composing model, not found
    expected = {
        "unknown_model": "composing model 'nope' is not available",
        "unknown_version": "step 0 (model 'identity'): version 7 of model 'identity' is not loaded (loaded: 1)",
        "bad_input": "step 0 (model 'identity'): input_map names input 'WRONG', which the model does not have",
        "bad_output": "step 0 (model 'identity'): output_map names output 'WRONG', which the model does not have",
        "bad_type": "ensemble tensor 'IN': ensemble input 'IN' is INT32, but input 'INPUT0' of step 0 (model "
        "'identity') takes FP32",
        "bad_dims": "ensemble tensor 'IN': ensemble input 'IN' has shape [-1, 8], but input 'INPUT0' of step 0 "
        "(model 'identity') takes [-1, 16]",
        "bad_out_type": "ensemble tensor 'OUT': output 'OUTPUT0' of step 0 (model 'identity') is FP32, but "
        "ensemble output 'OUT' takes FP64",
        "too_big": "step 0 (model 'small'): the ensemble has max_batch_size 8, but the model takes at most 2",
        "no_batching": "step 0 (model 'nobatch'): the ensemble has max_batch_size 8, but the model does not batch",
    }
    for name, words in expected.items():
        assert words in errors[name], (name, errors[name])


def config_error(repo: Path, name: str, config: str) -> ConfigError:
    write_ensemble(repo, name, config)
    with pytest.raises(ConfigError) as info:
        ModelRepository(repo, gpus=()).load(name)
    return info.value


def test_the_step_graph_is_checked_where_it_is_written(tmp_path: Path) -> None:
    a = step("m", {"INPUT0": "IN"}, {"OUTPUT0": "x"})
    b = step("m", {"INPUT0": "y"}, {"OUTPUT0": "OUT"})
    err = config_error(tmp_path, "dangling", ensemble("dangling", "IN:FP32:16", "OUT:FP32:16", f"{a},\n{b}"))
    assert "step 1 (model 'm') reads ensemble tensor 'y' into input 'INPUT0', but no step produces it" in err.message
    assert err.line == 9  # the second step's line
    cases = {
        "unproduced": (a, "ensemble output 'OUT' is not produced by any step's output_map"),
        "twice": (
            f"{a},\n" + step("m", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
            "ensemble tensor 'x' is produced by step 0 and by step 1 (model 'm')",
        ),
        "cycle": (
            ",\n".join(
                [
                    step("m", {"INPUT0": "y"}, {"OUTPUT0": "x"}),
                    step("m", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
                    step("m", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                ]
            ),
            "the ensemble's steps form a cycle (each waits for a tensor another one produces): step 0 (model 'm'), "
            "step 1 (model 'm')",
        ),
        "overwrite": (
            step("m", {"INPUT0": "IN"}, {"OUTPUT0": "IN"}),
            "step 0 (model 'm') writes ensemble tensor 'IN', which is an input of the ensemble",
        ),
    }
    for name, (steps, words) in cases.items():
        err = config_error(tmp_path, name, ensemble(name, "IN:FP32:16", "OUT:FP32:16", steps))
        assert words in err.message, (name, err.message)
    err = config_error(
        tmp_path, "batcher", ensemble("batcher", "IN:FP32:16", "OUT:FP32:16", a, extra="dynamic_batching { }")
    )
    assert 'oneof "scheduling_choice"' in err.message  # protobuf's own word: a scheduler or the steps
    assert err.line == 11
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.pbtxt").write_text(ensemble("bare", "IN:FP32:16", "OUT:FP32:16", a))
    with pytest.raises(ConfigError, match=r"no version directories \(numeric, like 1/\) \(an ensemble needs one"):
        ModelRepository(tmp_path, gpus=()).load("bare")


def test_only_the_steps_the_requested_outputs_need_are_planned(tmp_path: Path) -> None:
    write_ensemble(tmp_path, "pipe", pipe_config())
    plan = plan_ensemble(ModelRepository(tmp_path, gpus=()).load("pipe").config)
    assert [s.index for s in plan.steps_for(["SUM"])] == [0, 1]
    assert [s.index for s in plan.steps_for(["DIFF"])] == [0, 1, 2]
    assert [s.label for s in plan.steps] == [
        "step 0 (model 'identity')",
        "step 1 (model 'add_sub')",
        "step 2 (model 'identity')",
    ]
    with pytest.raises(EnsembleConfigError, match="needs ensemble_scheduling with at least one step"):
        plan_ensemble(ModelConfig(name="e", platform="ensemble"))


async def test_an_in_process_ensemble_request_keeps_the_error_kind(tmp_path: Path) -> None:
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    write_ensemble(
        tmp_path,
        "e",
        ensemble("e", "IN:FP32:-1", "OUT:FP32:16", step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
    )
    models = ModelManager(ModelRepository(tmp_path, gpus=()))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    try:
        wide = np.ones((1, 17), np.float32)
        with pytest.raises(InvalidArgument, match=r"^ensemble 'e' step 0 \(model 'identity'\): unexpected shape"):
            await dataplane.infer("e", None, InferRequest([Tensor("IN", "FP32", wide.shape, wide)]))
        ok = np.ones((2, 16), np.float32)
        answer = await dataplane.infer("e", "1", InferRequest([Tensor("IN", "FP32", ok.shape, ok)], id="r1"))
        assert answer.id == "r1"
        assert answer.model_version == "1"
        np.testing.assert_array_equal(answer.outputs[0].data, ok)
        counts = dataplane.statistics("e")["model_stats"][0]["inference_stats"]
        assert (counts["success"]["count"], counts["fail"]["count"]) == (1, 1)
    finally:
        await models.close()


async def test_a_traced_ensemble_request_shows_its_pipeline_as_one_batch(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from modelsvc.server import InferEndpoint
    from modelsvc.server.observe._tracing import TraceSettings, start_tracing

    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    two = ",\n".join(
        [step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "x"}), step("identity", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
    )
    write_ensemble(tmp_path, "e", ensemble("e", "IN:FP32:16", "OUT:FP32:16", two))
    models = ModelManager(ModelRepository(tmp_path, gpus=()))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    exporter = InMemorySpanExporter()
    tracing = dataplane.tracing = start_tracing(TraceSettings(mode="opentelemetry", rate=0), exporter)
    assert tracing is not None
    try:
        body = json.dumps({"inputs": [{"name": "IN", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]})
        header = [(b"traceparent", f"00-{0xE5:032x}-{0x1:016x}-01".encode())]
        reply = await InferEndpoint(dataplane).handle("e", None, header, body.encode())
        assert reply.status == 200
        tracing.provider.force_flush()
        spans = {s.name: s for s in exporter.get_finished_spans()}
    finally:
        tracing.shutdown()
        await models.close()
    assert {"infer e", "queue", "compute", "batch e"} <= set(spans)
    assert spans["compute"].attributes is not None
    assert spans["compute"].attributes["modelsvc.batch_size"] == 1


async def test_a_request_whose_caller_leaves_withdraws_its_running_steps(tmp_path: Path) -> None:
    held = "dynamic_batching { max_queue_delay_microseconds: 60000000 }"
    om.write_model(tmp_path, "held", om.identity(), identity_config("held", extra=held))
    both = ",\n".join(
        [step("held", {"INPUT0": "L"}, {"OUTPUT0": "LO"}), step("held", {"INPUT0": "R"}, {"OUTPUT0": "RO"})]
    )
    write_ensemble(tmp_path, "fork", ensemble("fork", "L:FP32:16 R:FP32:16", "LO:FP32:16 RO:FP32:16", both))
    models = ModelManager(ModelRepository(tmp_path, gpus=()))
    assert not await models.load_all()
    dataplane = DataPlane(models)
    dataplane.accepting = True
    try:
        x = np.ones((1, 16), np.float32)
        call = asyncio.create_task(
            dataplane.infer(
                "fork", None, InferRequest([Tensor("L", "FP32", x.shape, x), Tensor("R", "FP32", x.shape, x)])
            )
        )
        scheduler = models.get("held").scheduler
        while scheduler.pending_count < 2:  # both steps wait in held's queue (for a minute)
            assert not call.done()
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        deadline = time.monotonic() + 30
        while scheduler.pending_count:  # the steps leave the queue with their caller
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        fork = models.get("fork").scheduler
        assert isinstance(fork, EnsembleScheduler)
        assert fork.in_flight == 0
        assert stats_of(dataplane, "held")["inference_count"] == 0
    finally:
        await models.close()


def stats_of(dataplane: DataPlane, model: str) -> dict[str, Any]:
    result: dict[str, Any] = dataplane.statistics(model)["model_stats"][0]
    return result
