"""The sequence batcher (``sequence_batching``) on a real server, driven by tritonclient over HTTP, gRPC and gRPC
streaming: many interleaved sequences each get what running them alone gives, with the direct and oldest
strategies, implicit state (python and ONNX Runtime), the backlog beyond the slots, idle release and Triton's
errors. One server for the file, models from tests/data/seq_models plus an ONNX model built here."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from loadtests.bench_sequence import onnx_sum_model
from modelsvc.tools.onnx_models import write_model
from tests._server import ModelsvcProcess

T = TypeVar("T")
DATA = Path(__file__).parents[1] / "data" / "seq_models"

ONNX_CONFIG = """
name: "onnx_sum"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  direct { max_queue_delay_microseconds: 20000 minimum_slot_utilization: 1.0 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# the same graph with auto-complete: the config lists no inputs or outputs; the control and state tensors must
# not be added to them
ONNX_AUTO_CONFIG = """
name: "onnx_sum_auto"
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# the state output listed as an output too: a client may then read it (Triton's way to debug a state)
ONNX_DEBUG_CONFIG = (
    ONNX_CONFIG.replace('"onnx_sum"', '"onnx_sum_debug"')
    .replace(
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },\n'
        ' { name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]',
    )
    .replace("max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 0")
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("seq") / "models"
    shutil.copytree(DATA, repo)
    model = onnx_sum_model()
    write_model(repo, "onnx_sum", model, ONNX_CONFIG)
    write_model(repo, "onnx_sum_auto", model, ONNX_AUTO_CONFIG)
    write_model(repo, "onnx_sum_debug", model, ONNX_DEBUG_CONFIG)
    with ModelsvcProcess(repo) as proc:
        proc.wait_ready(60)
        yield proc


def _http_step(client: th.InferenceServerClient, model: str, sid: int | str, value: int, **flags: bool) -> Any:
    dtype = "FP32" if model.startswith("onnx") else "INT32"
    tensor = th.InferInput("INPUT", [1, 1], dtype)
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32 if dtype == "FP32" else np.int32))
    return client.infer(model, [tensor], sequence_id=sid, **flags)


def _grpc_input(value: int) -> tg.InferInput:
    tensor = tg.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _run_alone(values: list[int], start: int = 0) -> list[int]:
    return [start + sum(values[: i + 1]) for i in range(len(values))]


def _sequence_over_http(url: str, model: str, sid: int | str, values: list[int]) -> list[int]:
    client = th.InferenceServerClient(url)
    try:
        out = []
        for i, value in enumerate(values):
            result = _http_step(client, model, sid, value, sequence_start=i == 0, sequence_end=i == len(values) - 1)
            out.append(int(result.as_numpy("OUTPUT").reshape(-1)[0]))
            corrid = result.as_numpy("CORRID_OUT") if model.startswith("accumulate") else None
            if corrid is not None:
                assert corrid.reshape(-1)[0] in (str(sid).encode(), sid)
        return out
    finally:
        client.close()


def _each(pool: ThreadPoolExecutor, ids: Iterable[Any], run: Callable[[Any], T]) -> dict[Any, T]:
    """``run(id)`` for every id at once, on the pool's threads."""
    keys = list(ids)
    return dict(zip(keys, pool.map(run, keys), strict=True))


VALUES = {sid: [sid % 7 + i for i in range(4)] for sid in range(1, 9)}


# -- interleaved sequences ------------------------------------------------------------------------------------


def test_http_interleaved_sequences_direct_with_backlog(server: ModelsvcProcess) -> None:
    """8 sequences at once on 2 slots: 6 wait in the backlog, none is lost, each sums as if alone."""
    with ThreadPoolExecutor(8) as pool:
        results = _each(pool, VALUES, lambda s: _sequence_over_http(server.url, "accumulate", s, VALUES[s]))
    assert results == {sid: _run_alone(values) for sid, values in VALUES.items()}


def test_http_string_ids_and_implicit_state(server: ModelsvcProcess) -> None:
    with ThreadPoolExecutor(4) as pool:
        names = {f"doc-{i}": VALUES[i] for i in range(1, 5)}
        strings = _each(pool, names, lambda s: _sequence_over_http(server.url, "accumulate_strings", s, names[s]))
        state = _each(pool, VALUES, lambda s: _sequence_over_http(server.url, "accumulate_state", s, VALUES[s]))
    assert strings == {sid: _run_alone(values) for sid, values in names.items()}
    # the state starts from initial_state/hundred.bin (100); the state output never reaches the client
    assert state == {sid: _run_alone(values, 100) for sid, values in VALUES.items()}
    client = th.InferenceServerClient(server.url)
    result = _http_step(client, "accumulate_state", 99, 5, sequence_start=True, sequence_end=True)
    assert {o["name"] for o in result.get_response()["outputs"]} == {"OUTPUT", "CORRID_OUT"}
    assert int(result.as_numpy("CORRID_OUT")[0, 0]) == 99


def test_grpc_interleaved_sequences(server: ModelsvcProcess) -> None:
    def run(sid: int) -> list[int]:
        client = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        out = []
        values = VALUES[sid]
        for i, value in enumerate(values):
            result = client.infer(
                "accumulate_oldest",
                [_grpc_input(value)],
                sequence_id=sid,
                sequence_start=i == 0,
                sequence_end=i == len(values) - 1,
            )
            out.append(int(result.as_numpy("OUTPUT")[0, 0]))
        client.close()
        return out

    with ThreadPoolExecutor(8) as pool:
        results = _each(pool, VALUES, run)
    assert results == {sid: _run_alone(values) for sid, values in VALUES.items()}


def test_grpc_stream_interleaved_sequences(server: ModelsvcProcess) -> None:
    """One stream, the requests of 6 sequences sent round-robin without waiting: each sequence's answers in
    order, each as if alone; 2 slots, so 4 sequences start in the backlog."""
    answers: queue.Queue[Any] = queue.Queue()
    client = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    sids = list(range(101, 107))
    values = {sid: [sid - 100 + i for i in range(3)] for sid in sids}
    sent = 0
    for i in range(3):
        for sid in sids:
            client.async_stream_infer(
                "accumulate",
                [_grpc_input(values[sid][i])],
                request_id=f"{sid}-{i}",
                sequence_id=sid,
                sequence_start=i == 0,
                sequence_end=i == 2,
            )
            sent += 1
    got: dict[int, list[int]] = {sid: [] for sid in sids}
    for _ in range(sent):
        result, error = answers.get(timeout=30)
        assert error is None, error
        sid, _step = result.get_response().id.split("-")
        got[int(sid)].append(int(result.as_numpy("OUTPUT")[0, 0]))
    client.stop_stream()
    client.close()
    assert got == {sid: _run_alone(v) for sid, v in values.items()}


def test_oldest_batches_several_sequences(server: ModelsvcProcess) -> None:
    """The oldest strategy puts the requests of several sequences in one batch (the model sees them together
    and the statistics count batches larger than 1), never two of one sequence."""
    before = server.model_stats("accumulate_oldest")
    barrier = threading.Barrier(4)

    def run(sid: int) -> list[int]:
        client = th.InferenceServerClient(server.url)
        sizes = []
        for i in range(3):
            barrier.wait(timeout=30)
            result = _http_step(client, "accumulate_oldest", 200 + sid, 1, sequence_start=i == 0, sequence_end=i == 2)
            sizes.append(int(result.as_numpy("BATCH")[0, 0]))
        client.close()
        return sizes

    with ThreadPoolExecutor(4) as pool:
        sizes = [s for batch in pool.map(run, range(4)) for s in batch]
    stats = server.model_stats("accumulate_oldest")
    assert max(sizes) > 1
    assert max(sizes) <= 4
    assert stats["inference_count"] - before["inference_count"] == 12
    assert stats["execution_count"] - before["execution_count"] < 12
    assert any(b["batch_size"] > 1 for b in stats["batch_stats"])


def test_onnx_state_direct_padded_batches(server: ModelsvcProcess) -> None:
    """ONNX Runtime with control and state tensors in the graph: 4 slots, a full batch waits up to 20 ms for every
    slot; 3 live sequences leave an empty row (READY 0) in each batch, which the statistics count as executed."""
    before = server.model_stats("onnx_sum")
    barrier = threading.Barrier(3)

    def run(sid: int) -> list[float]:
        client = th.InferenceServerClient(server.url)
        out = []
        for i, value in enumerate([1.0, 2.0, 3.0]):
            barrier.wait(timeout=30)
            result = _http_step(client, "onnx_sum", sid, int(value * sid), sequence_start=i == 0, sequence_end=i == 2)
            out.append(float(result.as_numpy("OUTPUT")[0, 0]))
        client.close()
        return out

    with ThreadPoolExecutor(3) as pool:
        results = _each(pool, [1, 2, 3], run)
    assert results == {sid: [1.0 * sid, 3.0 * sid, 6.0 * sid] for sid in (1, 2, 3)}
    stats = server.model_stats("onnx_sum")
    assert stats["inference_count"] - before["inference_count"] == 9
    assert stats["execution_count"] - before["execution_count"] < 9  # sequences shared batches
    # a hole below the highest live slot: A (slot 0) ends while B and C (slots 1, 2) go on, so their batches
    # run 3 rows, row 0 empty with READY 0, and it changes nobody's sum
    before = server.model_stats("onnx_sum")
    http = th.InferenceServerClient(server.url)
    _http_step(http, "onnx_sum", 31, 1, sequence_start=True)
    _http_step(http, "onnx_sum", 32, 1, sequence_start=True)
    _http_step(http, "onnx_sum", 33, 1, sequence_start=True)
    _http_step(http, "onnx_sum", 31, 1, sequence_end=True)
    assert float(_http_step(http, "onnx_sum", 32, 5, sequence_end=True).as_numpy("OUTPUT")[0, 0]) == 6.0
    assert float(_http_step(http, "onnx_sum", 33, 7, sequence_end=True).as_numpy("OUTPUT")[0, 0]) == 8.0
    stats = server.model_stats("onnx_sum")
    assert stats["inference_count"] - before["inference_count"] == 6
    assert _rows(stats) - _rows(before) > 6
    metadata = th.InferenceServerClient(server.url).get_model_metadata("onnx_sum_auto")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
    assert [t["name"] for t in metadata["outputs"]] == ["OUTPUT"]
    assert _sequence_over_http(server.url, "onnx_sum_auto", 5, [1, 2]) == [1, 3]
    _http_step(http, "onnx_sum_debug", 6, 4, sequence_start=True)
    debug = _http_step(http, "onnx_sum_debug", 6, 5, sequence_end=True)
    assert (float(debug.as_numpy("OUTPUT")[0, 0]), float(debug.as_numpy("SUM_OUT")[0, 0])) == (9.0, 9.0)


def _rows(stats: dict[str, Any]) -> int:
    """Rows executed, empty ones included: batch size x executions, over the batch statistics."""
    return sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"])


# -- errors ---------------------------------------------------------------------------------------------------


def _refused(call: Any) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value)


def test_errors_with_tritons_messages(server: ModelsvcProcess) -> None:
    http = th.InferenceServerClient(server.url)
    grpc = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    no_id = _refused(lambda: _http_step(http, "accumulate", 0, 1, sequence_start=True))
    assert "[400] inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID" in no_id
    never = _refused(lambda: _http_step(http, "accumulate", 4242, 1))
    assert "inference request for sequence 4242 to model 'accumulate' must specify the START flag" in never
    _http_step(http, "accumulate", 4243, 1, sequence_start=True, sequence_end=True)
    after_end = _refused(lambda: grpc.infer("accumulate", [_grpc_input(1)], sequence_id=4243))
    assert "StatusCode.INVALID_ARGUMENT" in after_end
    assert "must specify the START flag" in after_end
    two = th.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    batch = _refused(lambda: http.infer("accumulate", [two], sequence_id=5, sequence_start=True))
    assert "must specify batch-size 1 due to requirements of sequence batcher" in batch
    text_id = _refused(lambda: _http_step(http, "accumulate_state", "abc", 1, sequence_start=True))
    assert "has string correlation ID 'abc', but its CORRID control 'CORRID' takes integers (UINT64)" in text_id
    # the server keeps serving
    assert _sequence_over_http(server.url, "accumulate", 4244, [2, 3]) == [2, 5]


def test_idle_sequence_is_released(server: ModelsvcProcess) -> None:
    """accumulate_state releases a sequence idle for 300 ms: its next request is refused as one never started;
    a START with the same id begins again from the initial state."""
    http = th.InferenceServerClient(server.url)
    assert int(_http_step(http, "accumulate_state", 77, 1, sequence_start=True).as_numpy("OUTPUT")[0, 0]) == 101
    assert _gauge(server, "modelsvc_sequence_active", "accumulate_state") == 1.0
    time.sleep(0.7)
    assert _gauge(server, "modelsvc_sequence_active", "accumulate_state") == 0.0
    assert _gauge(server, "modelsvc_sequence_backlog", "accumulate_state") == 0.0
    late = _refused(lambda: _http_step(http, "accumulate_state", 77, 1))
    assert "inference request for sequence 77 to model 'accumulate_state' must specify the START flag" in late
    again = _http_step(http, "accumulate_state", 77, 2, sequence_start=True, sequence_end=True)
    assert int(again.as_numpy("OUTPUT")[0, 0]) == 102


def _gauge(server: ModelsvcProcess, name: str, model: str) -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model} in the metrics")
