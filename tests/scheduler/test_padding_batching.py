"""Padding-aware batching seen from outside: real ``modelsvc serve`` processes driven by tritonclient.

Requests of different token lengths to a model whose config names ``pad_inputs`` share batches; every answer is
compared with the same request sent alone to the same model served without padding. The batches are held
together by a long ``max_queue_delay_microseconds`` and closed by ``preferred_batch_size`` (the rows of a batch
arrive, the batch starts), so which requests share a batch does not depend on timing; the statistics, the
metrics (``modelsvc_batch_tokens_*``, ``modelsvc_batch_fill``) and the trace's batch spans
(``modelsvc.padded_length``) are then checked against what was sent.
"""

from __future__ import annotations

import itertools
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.utils import InferenceServerException

from modelsvc.backends import ModelConfig
from modelsvc.scheduler._padding import PadSpec
from modelsvc.server.observe._tracing import TraceSettings, start_tracing
from modelsvc.tools import onnx_models as om
from tests._server import ROOT, ModelsvcProcess
from tests.conftest import infer_input
from tests.server.test_tracing_server import OtlpReceiver, attrs

pytestmark = pytest.mark.integration

WAIT = 60.0
HIDDEN = 8
VOCAB = 97
HOLD = 10_000_000
"""Ten seconds: a batch of requests that all fit starts because its rows arrived (preferred_batch_size), never
because the delay ran out. Requests of spread lengths fill batches of similar lengths only (the planner keeps a
batch's fill above its floor), so models that get them wait ``GATHER`` for all of them to arrive, then go."""
GATHER = 2_000_000

Array = np.ndarray[Any, Any]

# --- the models -------------------------------------------------------------------------------------------


def masked_encoder() -> onnx.ModelProto:
    """A BERT-shaped toy: ``last_hidden_state`` [N, L, H] = tanh(E[input_ids]) token by token, and
    ``sentence_embedding`` [N, H] its mean over the tokens whose ``attention_mask`` is 1. Padding both inputs
    with 0 changes neither output at a request's own positions."""
    table = np.random.default_rng(14).standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
        helper.make_node("Tanh", ["embedded"], ["last_hidden_state"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "two"], ["mask3"]),
        helper.make_node("Mul", ["last_hidden_state", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "one"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["sentence_embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "length", HIDDEN]),
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", HIDDEN]),
        ],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", om.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


MASKED_IO = f"""input [ {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
        {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }} ]
output [ {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {HIDDEN} ] }},
         {{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }} ]
"""
MINILM_IO = """input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] },
         { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ 384 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def parameters(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in values.items())


MASKED_PAD = parameters(pad_inputs="input_ids:0=0,attention_mask:0=0", pad_outputs="last_hidden_state:0")
MINILM_PAD = parameters(
    pad_inputs="input_ids:0=0,attention_mask:0=0,token_type_ids:0=0", pad_outputs="last_hidden_state:0"
)


def config(name: str, io: str, max_batch_size: int, rest: str = "", backend: str = "onnxruntime") -> str:
    return f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {max_batch_size}\n{io}{rest}'


def held(rows: int, delay_us: int = HOLD) -> str:
    return f"dynamic_batching {{ preferred_batch_size: [ {rows} ] max_queue_delay_microseconds: {delay_us} }}\n"


PY_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()
            rows, length = tokens.shape
            seen = np.array([[length, len(requests)]] * rows, np.int32)
            pads = (tokens == -1).sum(axis=1, keepdims=True).astype(np.int32)
            outputs = [pb_utils.Tensor("DOUBLED", tokens * 2), pb_utils.Tensor("SEEN", seen),
                       pb_utils.Tensor("PADS", pads)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""
PY_IO = """input [ { name: "TOKENS" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "DOUBLED" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "SEEN" data_type: TYPE_INT32 dims: [ 2 ] },
         { name: "PADS" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
BUCKETS = (8, 16, 32, 64)


def write_python_model(repo: Path, name: str, config_text: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(PY_MODEL)
    (repo / name / "config.pbtxt").write_text(config_text)


@pytest.fixture(scope="module")
def minilm_onnx() -> Path:
    """The example services' MiniLM (built once by ``services.build``; a no-op when it is there)."""
    from services import build

    build.build()
    assert not build.missing(), build.missing()
    return build.model_file("embedder")  # ONNX Runtime fp32 on every CPU (the classifier may be OpenVINO's)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, minilm_onnx: Path) -> Path:
    repo = tmp_path_factory.mktemp("padding_repo")
    encoder = masked_encoder()
    om.write_model(repo, "masked_plain", encoder, config("masked_plain", MASKED_IO, 8))
    om.write_model(repo, "masked_pad", encoder, config("masked_pad", MASKED_IO, 8, held(8, GATHER) + MASKED_PAD))
    buckets = parameters(pad_buckets=",".join(map(str, BUCKETS)))
    om.write_model(
        repo, "masked_bucket", encoder, config("masked_bucket", MASKED_IO, 4, held(4) + MASKED_PAD + buckets)
    )
    py_pad = parameters(pad_inputs="TOKENS:0=-1", pad_outputs="DOUBLED:0")
    write_python_model(repo, "py_pad", config("py_pad", PY_IO, 4, held(4) + py_pad, backend="python"))
    for name, rest in (("minilm_plain", ""), ("minilm_pad", held(8, GATHER) + MINILM_PAD)):
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(minilm_onnx, repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(config(name, MINILM_IO, 8, rest))
    return repo


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def server(repository: Path, receiver: OtlpReceiver) -> Iterator[ModelsvcProcess]:
    trace = ("mode=opentelemetry", "rate=1", f"opentelemetry,url={receiver.url}", "opentelemetry,bsp_schedule_delay=50")
    flags = [f for setting in trace for f in ("--trace-config", setting)]
    with ModelsvcProcess(repository, *flags) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ModelsvcProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, concurrency=16)
    yield c
    c.close()


# --- requests, answers, metrics, spans --------------------------------------------------------------------


def tokens(length: int, seed: int, rows: int = 1, vocab: int = VOCAB) -> Array:
    return np.random.default_rng(seed).integers(1, vocab, (rows, length)).astype(np.int64)


def encoder_inputs(ids: Array, token_types: bool = False) -> dict[str, Array]:
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if token_types:
        inputs["token_type_ids"] = np.zeros_like(ids)
    return inputs


def http_inputs(inputs: dict[str, Array]) -> list[httpclient.InferInput]:
    return [infer_input(name, array) for name, array in inputs.items()]


def answers(results: list[Any], names: tuple[str, ...]) -> list[dict[str, Array]]:
    return [{name: r.as_numpy(name) for name in names} for r in results]


def alone(client: httpclient.InferenceServerClient, model: str, requests: list[dict[str, Array]]) -> list[Any]:
    """Each request sent on its own, one after the other."""
    return [client.infer(model, http_inputs(inputs)) for inputs in requests]


_TRACE_IDS = itertools.count(0x9AD0000001)


def together(
    client: httpclient.InferenceServerClient, model: str, requests: list[dict[str, Array]]
) -> tuple[list[Any], set[int]]:
    """All requests in flight at once, each in a trace of its own: the answers, and the requests' trace ids."""
    trace_ids = [next(_TRACE_IDS) for _ in requests]
    pending = [
        client.async_infer(model, http_inputs(inputs), headers={"traceparent": f"00-{trace_id:032x}-{1:016x}-01"})
        for inputs, trace_id in zip(requests, trace_ids, strict=True)
    ]
    return [p.get_result() for p in pending], set(trace_ids)


def assert_same_answers(got: list[dict[str, Array]], want: list[dict[str, Array]], lengths: list[int]) -> None:
    for i, (g, w, length) in enumerate(zip(got, want, lengths, strict=True)):
        for name, array in w.items():
            assert g[name].shape == array.shape, (i, name, g[name].shape, array.shape)
            np.testing.assert_allclose(g[name], array, rtol=0, atol=1e-5, err_msg=f"request {i}, {name}")
        if "last_hidden_state" in w:
            assert w["last_hidden_state"].shape[1] == length


Samples = dict[tuple[str, str, str], float]


def scrape(server: ModelsvcProcess) -> Samples:
    """``(sample name, model, le)`` -> value for every sample with a model label."""
    samples = {}
    for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        labels_text, _, value = rest.rpartition("} ")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
        if "model" in labels:
            samples[(name, labels["model"], labels.get("le", ""))] = float(value)
    return samples


def delta(before: Samples, after: Samples, name: str, model: str, le: str = "") -> float:
    key = (name, model, le)
    assert key in after, f"{name} for {model} (le={le!r}) is not exported"
    return after[key] - before.get(key, 0.0)


def executions(server: ModelsvcProcess, model: str) -> tuple[int, int]:
    stats = server.model_stats(model)
    return stats["inference_count"], stats["execution_count"]


def batch_spans(receiver: OtlpReceiver, model: str, trace_ids: set[int], count: int) -> list[dict[str, object]]:
    """The attributes of the ``count`` batch spans of ``model`` that ran requests of ``trace_ids`` (a batch span
    lives in the trace of its first request), once the server exported them all."""
    deadline = time.monotonic() + WAIT
    while True:
        spans = [
            attrs(s)
            for _, s in receiver.spans()
            if s.name == f"batch {model}" and int.from_bytes(s.trace_id, "big") in trace_ids
        ]
        if len(spans) >= count:
            assert len(spans) == count, spans
            return spans
        assert time.monotonic() < deadline, f"{len(spans)} of {count} batch spans of {model} arrived"
        time.sleep(0.05)


def check_shared_batches(
    client: httpclient.InferenceServerClient,
    server: ModelsvcProcess,
    receiver: OtlpReceiver,
    padded: str,
    plain: str,
    requests: list[dict[str, Array]],
    names: tuple[str, ...],
) -> None:
    """``requests`` in flight together at ``padded`` share batches, each answers as alone at ``plain``, and the
    statistics, metrics and batch spans add up to what was sent."""
    lengths = [inputs["input_ids"].shape[1] for inputs in requests]
    want = answers(alone(client, plain, requests), names)
    metrics_before = scrape(server)
    inferences_before, executions_before = executions(server, padded)
    results, trace_ids = together(client, padded, requests)
    got = answers(results, names)
    assert_same_answers(got, want, lengths)
    inferences, runs = executions(server, padded)
    inferences, runs = inferences - inferences_before, runs - executions_before
    assert inferences == len(requests)
    assert runs < len(requests), "the requests did not share batches"
    spans = batch_spans(receiver, padded, trace_ids, runs)
    assert sum(int(str(s["modelsvc.batch_size"])) for s in spans) == len(requests)
    for span in spans:  # no buckets: each batch is padded to its longest request
        assert int(str(span["modelsvc.padded_length"])) in lengths
    computed = sum(int(str(s["modelsvc.batch_size"])) * int(str(s["modelsvc.padded_length"])) for s in spans)
    metrics = scrape(server)
    useful = delta(metrics_before, metrics, "modelsvc_batch_tokens_useful", padded)
    assert useful == sum(lengths)
    assert delta(metrics_before, metrics, "modelsvc_batch_tokens_computed", padded) == computed >= useful
    assert delta(metrics_before, metrics, "modelsvc_batch_fill_count", padded) == runs


# --- sharing batches, exactly ---------------------------------------------------------------------------

LENGTHS = [int(n) for n in np.linspace(3, 60, 16)]


def test_requests_of_sixteen_lengths_share_batches_of_the_masked_model(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess, receiver: OtlpReceiver
) -> None:
    requests = [encoder_inputs(tokens(length, seed)) for seed, length in enumerate(LENGTHS)]
    names = ("last_hidden_state", "sentence_embedding")
    check_shared_batches(client, server, receiver, "masked_pad", "masked_plain", requests, names)


def test_minilm_answers_in_shared_batches_as_alone(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess, receiver: OtlpReceiver
) -> None:
    requests = [encoder_inputs(tokens(length, seed, vocab=30000), True) for seed, length in enumerate(LENGTHS)]
    names = ("last_hidden_state", "sentence_embedding")
    check_shared_batches(client, server, receiver, "minilm_pad", "minilm_plain", requests, names)


def test_one_batch_padded_to_its_bucket_metrics_and_span(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess, receiver: OtlpReceiver
) -> None:
    """Four rows close a batch of masked_bucket: lengths 31, 30, 29 and 28 run padded to the bucket 32, then a
    two-row request of length 7 and two of length 6 run padded to 8, then a four-row request of length 9 (four
    rows: it fills a batch alone) runs padded to 16. Every request of a round keeps the batch's fill above the
    planner's floor, so the four rows always meet in one batch."""
    rounds = [
        ([(31, 1), (30, 1), (29, 1), (28, 1)], 32),
        ([(7, 2), (6, 1), (6, 1)], 8),
        ([(9, 4)], 16),
    ]
    fills = []
    for number, (shapes, bucket) in enumerate(rounds):
        requests = [encoder_inputs(tokens(length, 100 + i, rows)) for i, (length, rows) in enumerate(shapes)]
        want = answers(alone(client, "masked_plain", requests), ("last_hidden_state", "sentence_embedding"))
        before = scrape(server)
        _, runs_before = executions(server, "masked_bucket")
        results, trace_ids = together(client, "masked_bucket", requests)
        got = answers(results, ("last_hidden_state", "sentence_embedding"))
        assert_same_answers(got, want, [length for length, _ in shapes])
        assert executions(server, "masked_bucket")[1] - runs_before == 1
        after = scrape(server)
        useful = sum(length * rows for length, rows in shapes)
        computed = 4 * bucket
        assert delta(before, after, "modelsvc_batch_tokens_useful", "masked_bucket") == useful
        assert delta(before, after, "modelsvc_batch_tokens_computed", "masked_bucket") == computed
        fill = useful / computed
        fills.append(fill)
        assert delta(before, after, "modelsvc_batch_fill_count", "masked_bucket") == 1
        assert delta(before, after, "modelsvc_batch_fill_sum", "masked_bucket") == pytest.approx(fill)
        for le in ("0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0", "+Inf"):
            inside = 1 if fill <= float(le) else 0
            assert delta(before, after, "modelsvc_batch_fill_bucket", "masked_bucket", le) == inside, (number, le)
        assert ("modelsvc_batch_tokens_computed", "masked_plain", "") not in after  # only models that pad
        (span,) = batch_spans(receiver, "masked_bucket", trace_ids, 1)
        assert (span["modelsvc.batch_size"], span["modelsvc.padded_length"]) == (4, bucket)
    assert fills == [118 / 128, 26 / 32, 36 / 64]  # the buckets le=1.0, 0.9 and 0.6


def test_a_python_model_sees_one_length_per_batch_and_answers_at_its_own(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    """py_pad pads TOKENS with -1: inside the batch every request has the longest length (11), with as many -1
    as it was short; DOUBLED comes back at each request's own length, SEEN and PADS (fixed dims) as computed."""
    lengths = [9, 10, 10, 11]
    sent = [np.arange(1, n + 1, dtype=np.int32).reshape(1, n) for n in lengths]
    pending = [client.async_infer("py_pad", [infer_input("TOKENS", t)]) for t in sent]
    results = [p.get_result() for p in pending]
    for t, result, n in zip(sent, results, lengths, strict=True):
        np.testing.assert_array_equal(result.as_numpy("DOUBLED"), t * 2)
        assert result.as_numpy("SEEN").tolist() == [[11, 4]]
        assert result.as_numpy("PADS").tolist() == [[11 - n]]


def test_grpc_requests_share_a_batch_and_answer_as_alone(
    client: httpclient.InferenceServerClient, server: ModelsvcProcess
) -> None:
    lengths = [50, 55, 60, 64]
    requests = [encoder_inputs(tokens(length, 200 + i)) for i, length in enumerate(lengths)]
    names = ("last_hidden_state", "sentence_embedding")
    want = answers(alone(client, "masked_plain", requests), names)
    _, runs_before = executions(server, "masked_bucket")
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as grpc:

        def send(inputs: dict[str, Array]) -> Any:
            grpc_inputs = []
            for name, array in inputs.items():
                inp = grpcclient.InferInput(name, list(array.shape), "INT64")
                inp.set_data_from_numpy(array)
                grpc_inputs.append(inp)
            return grpc.infer("masked_bucket", grpc_inputs)

        with ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(send, requests))
    assert_same_answers(answers(results, names), want, lengths)
    assert executions(server, "masked_bucket")[1] - runs_before == 1


# --- refused requests -----------------------------------------------------------------------------------


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == "400", info.value
    return str(info.value.message())


def test_a_request_longer_than_the_largest_bucket_is_a_400_naming_the_tensor(
    client: httpclient.InferenceServerClient,
) -> None:
    message = refusal(lambda: client.infer("masked_bucket", http_inputs(encoder_inputs(tokens(65, 1)))))
    assert "input_ids" in message
    assert "64" in message
    # the largest bucket itself is served (four rows: a batch of their own, no wait)
    result = client.infer("masked_bucket", http_inputs(encoder_inputs(tokens(64, 1, rows=4))))
    assert result.as_numpy("last_hidden_state").shape == (4, 64, HIDDEN)


def test_padded_inputs_of_unequal_lengths_are_a_400_naming_both(client: httpclient.InferenceServerClient) -> None:
    inputs = {"input_ids": tokens(5, 2), "attention_mask": np.ones((1, 6), np.int64)}
    message = refusal(lambda: client.infer("masked_pad", http_inputs(inputs)))
    assert "input_ids" in message
    assert "attention_mask" in message
    assert "5" in message
    assert "6" in message


# --- bad configurations ---------------------------------------------------------------------------------

BAD_CONFIGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "unknown_input": (
        held(4) + parameters(pad_inputs="input_idz:0=0,attention_mask:0=0", pad_outputs="last_hidden_state:0"),
        ("pad_inputs", "input_idz"),
    ),
    "axis_out_of_range": (
        held(4) + parameters(pad_inputs="input_ids:1=0,attention_mask:0=0", pad_outputs="last_hidden_state:0"),
        ("pad_inputs", "input_ids"),
    ),
    "pad_value_not_an_int": (
        held(4) + parameters(pad_inputs="input_ids:0=zero,attention_mask:0=0", pad_outputs="last_hidden_state:0"),
        ("pad_inputs", "input_ids"),
    ),
    "buckets_descending": (
        held(4) + MASKED_PAD + parameters(pad_buckets="32,16"),
        ("pad_buckets",),
    ),
    "buckets_not_positive_integers": (
        held(4) + MASKED_PAD + parameters(pad_buckets="0,16,thirty-two"),
        ("pad_buckets",),
    ),
    "budget_below_a_row": (
        held(4) + MASKED_PAD + parameters(pad_buckets="8,16,32,64", max_batch_tokens="32"),
        ("max_batch_tokens",),
    ),
    "call_cost_not_a_non_negative_integer": (
        held(4) + MASKED_PAD + parameters(pad_call_cost_tokens="-5"),
        ("pad_call_cost_tokens",),
    ),
    "no_dynamic_batching": (MASKED_PAD, ("pad_inputs", "dynamic_batching")),
    "buckets_without_pad_inputs": (held(4) + parameters(pad_buckets="8,16"), ("pad_buckets", "pad_inputs")),
    "unlisted_variable_output": (
        held(4) + parameters(pad_inputs="input_ids:0=0,attention_mask:0=0"),
        ("pad_outputs", "last_hidden_state"),
    ),
    "unknown_output": (
        held(4) + parameters(pad_inputs="input_ids:0=0,attention_mask:0=0", pad_outputs="hidden:0"),
        ("pad_outputs", "hidden"),
    ),
}


def test_bad_padding_configurations_fail_their_load_naming_key_and_tensor(tmp_path: Path) -> None:
    encoder = masked_encoder()
    for name, (rest, _) in BAD_CONFIGS.items():
        om.write_model(tmp_path, name, encoder, config(name, MASKED_IO, 4, rest))
    # a fixed dim cannot be padded
    fixed = held(4) + parameters(pad_inputs="INPUT0:0")
    om.write_model(tmp_path, "fixed_dim", om.identity(), config("fixed_dim", om_identity_io(), 4, fixed))
    # no batch dimension: nothing to batch
    unbatched_io = f"""input [ {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }},
        {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1, -1 ] }} ]
output [ {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, -1, {HIDDEN} ] }},
         {{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [ -1, {HIDDEN} ] }} ]
"""
    unbatched = parameters(  # (dynamic_batching with max_batch_size 0 is refused before padding is read)
        pad_inputs="input_ids:1=0,attention_mask:1=0", pad_outputs="last_hidden_state:1"
    )
    om.write_model(tmp_path, "unbatched", encoder, config("unbatched", unbatched_io, 0, unbatched))
    # a short delay: the one request sent below would wait HOLD (10 s) for three others that never come
    om.write_model(tmp_path, "good", encoder, config("good", MASKED_IO, 4, held(4, 1000) + MASKED_PAD))
    expected = {
        **{name: words for name, (_, words) in BAD_CONFIGS.items()},
        "fixed_dim": ("pad_inputs", "INPUT0"),
        "unbatched": ("pad_inputs", "max_batch_size"),
    }
    proc = ModelsvcProcess(tmp_path, "--exit-on-error", "false").start()
    try:
        proc.wait_ready(WAIT, path="/v2/health/live")
        index = {row["name"]: row for row in httpx.post(f"{proc.base}/v2/repository/index", timeout=10).json()}
        assert index["good"]["state"] == "READY", index["good"]
        for name, words in expected.items():
            row = index[name]
            assert row["state"] == "UNAVAILABLE", (name, row)
            for word in words:
                assert word in row["reason"], (name, word, row["reason"])
        with httpclient.InferenceServerClient(proc.url) as c:
            result = c.infer("good", http_inputs(encoder_inputs(tokens(7, 3))))
            assert result.as_numpy("last_hidden_state").shape == (1, 7, HIDDEN)
    finally:
        proc.terminate()


def om_identity_io() -> str:
    return """input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


# --- the batch span's attribute, in process -------------------------------------------------------------


def test_the_batch_span_carries_the_padded_length_only_when_padded() -> None:
    exporter = InMemorySpanExporter()
    tracing = start_tracing(TraceSettings(mode="opentelemetry", rate=1), exporter)
    assert tracing is not None
    for padded_length in (32, None):
        request = tracing.start("enc", "1", [])
        assert request is not None
        request.enqueued("1")
        batch = request.batch_started([request], 3, padded_length=padded_length)
        batch.finished(None, (1, 2, 3))
        request.end(200, None)
    tracing.shutdown()
    batches = [s.attributes for s in exporter.get_finished_spans() if s.name == "batch enc"]
    assert [None if a is None else a.get("modelsvc.padded_length") for a in batches] == [32, None]
    assert all(a is not None and a["modelsvc.batch_size"] == 3 for a in batches)


def test_the_readme_example_is_a_padding_config_for_minilm() -> None:
    """The README's BERT-style example parses, names the exported MiniLM's tensors, and reads as documented."""
    (block,) = re.findall(r"```protobuf\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    config = text_format.Parse('name: "minilm"\nbackend: "onnxruntime"\n' + block, ModelConfig())
    assert [i.name for i in config.input] + [o.name for o in config.output] == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "last_hidden_state",
        "sentence_embedding",
    ]
    spec = PadSpec.from_model_config(config)
    assert spec is not None
    assert [(i.name, i.axis, i.value) for i in spec.inputs] == [
        ("input_ids", 1, 0),
        ("attention_mask", 1, 0),
        ("token_type_ids", 1, 0),
    ]
    assert dict(spec.outputs) == {"last_hidden_state": 1}
    assert (spec.buckets, spec.max_batch_tokens) == ((32, 64, 128, 256, 512), 16384)
