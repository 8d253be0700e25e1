"""Decoupled python models (``model_transaction_policy { decoupled: true }``) over tritonclient's gRPC streaming.

One modelsvc process (the default gRPC engine, h2) serves tests/data/decoupled: ``repeat`` sends N responses per
request (from execute or, with a delay, from a thread of its own; batched by the dynamic batcher) and
``repeat_async`` does the same with ``async def execute``. tests/server/test_decoupled_grpcio.py runs the stream checks
on the grpcio engine.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests._server import ModelsvcProcess

REPOSITORY = Path(__file__).parents[1] / "data" / "decoupled"
CLOSED = "Unable to send response. Response sender has been closed."


@pytest.fixture(scope="module")
def server() -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(REPOSITORY, "--grpc-address", "127.0.0.1") as proc:
        yield proc


def inputs(n: int, delay_ms: int = 0, error_at: int = -1, batched: bool = True) -> list[Any]:
    """N, DELAY_MS and ERROR_AT for ``repeat`` (batched: a batch dimension of 1) or ``repeat_async``."""
    shape = [1, 1] if batched else [1]
    out = []
    for name, value in (("N", n), ("DELAY_MS", delay_ms), ("ERROR_AT", error_at)):
        tensor = grpcclient.InferInput(name, shape, "INT32")
        tensor.set_data_from_numpy(np.full(shape, value, np.int32))
        out.append(tensor)
    return out


class Stream:
    """A tritonclient stream whose callback queues (result, error) pairs."""

    def __init__(self, grpc_url: str) -> None:
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def take(self, count: int, timeout: float = 20.0) -> list[tuple[Any, Any]]:
        return [self.got.get(timeout=timeout) for _ in range(count)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def grpc_url(server: ModelsvcProcess) -> str:
    return f"127.0.0.1:{server.grpc_port}"


def by_request(answers: list[tuple[Any, Any]]) -> dict[str, list[tuple[list[int], bool]]]:
    """Each request's responses in arrival order: (OUT as a list, triton_final_response)."""
    seen: dict[str, list[tuple[list[int], bool]]] = {}
    for result, error in answers:
        assert error is None, error
        response = result.get_response()
        out = result.as_numpy("OUT")
        values = [] if out is None else out.reshape(-1).tolist()
        seen.setdefault(response.id, []).append((values, response.parameters["triton_final_response"].bool_param))
    return seen


def check_many_in_flight(url: str) -> None:
    """Requests with 0 to 6 responses each, some from the execute thread, some from the model's threads, all in
    flight on one stream: every response arrives, in order per request, the final marker on the last; N=0 gives
    one empty final response when asked for one and nothing otherwise."""
    stream = Stream(url)
    try:
        plan = {f"r{i}": (i % 7, 3 if i % 3 == 0 else 0) for i in range(24)}
        for rid, (n, delay) in plan.items():
            stream.client.async_stream_infer(
                "repeat", inputs(n, delay), request_id=rid, enable_empty_final_response=rid != "r14"
            )
        # r14 (N=0, no empty final response asked) sends nothing; r0, r7 and r21 (N=0) one empty final response each
        expected = sum(n for n, _ in plan.values()) + 3
        seen = by_request(stream.take(expected))
        assert stream.got.empty()
    finally:
        stream.close()
    assert "r14" not in seen
    for rid, (n, _) in plan.items():
        if rid == "r14":
            continue
        if n == 0:
            assert seen[rid] == [([], True)]
        else:
            assert seen[rid] == [([i], i == n - 1) for i in range(n)], rid


def test_many_requests_in_flight_get_all_their_responses_in_order(server: ModelsvcProcess) -> None:
    check_many_in_flight(grpc_url(server))


def test_the_dynamic_batcher_batches_decoupled_requests(server: ModelsvcProcess) -> None:
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat", inputs(1, 200), request_id="slow")  # holds the instance a moment
        for i in range(8):
            stream.client.async_stream_infer("repeat", inputs(1), request_id=f"b{i}")
        answers = stream.take(9)
    finally:
        stream.close()
    batches = [int(result.as_numpy("BATCH").reshape(-1)[0]) for result, _ in answers]
    assert max(batches) > 1, batches


def test_async_execute_frees_the_instance_while_a_request_waits(server: ModelsvcProcess) -> None:
    """``repeat_async`` (one instance, async def execute): the responses of requests sent together interleave."""
    stream = Stream(grpc_url(server))
    try:
        for rid in ("a", "b", "c"):
            stream.client.async_stream_infer("repeat_async", inputs(4, 20, batched=False), request_id=rid)
        answers = stream.take(12)
    finally:
        stream.close()
    order = [result.get_response().id for result, _ in answers]
    assert order.index("b") < len(order) - 1 - order[::-1].index("a"), order  # b started before a ended
    seen = by_request(answers)
    assert all(seen[rid] == [([i], i == 3) for i in range(4)] for rid in "abc")


def test_an_error_sent_mid_stream_reaches_the_client_and_the_stream_goes_on(server: ModelsvcProcess) -> None:
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat", inputs(3, error_at=1), request_id="e")
        first, second, third = stream.take(3)
        stream.client.async_stream_infer("repeat_async", inputs(2, error_at=0, batched=False), request_id="f")
        fourth, fifth = stream.take(2)
        stream.client.async_stream_infer("repeat", inputs(1), request_id="after")
        (last,) = stream.take(1)
    finally:
        stream.close()
    assert first[0].as_numpy("OUT").tolist() == [[0]]
    assert second[0] is None
    assert isinstance(second[1], InferenceServerException)
    assert second[1].message() == "error at response 1"
    assert third[0].as_numpy("OUT").tolist() == [[2]]
    assert third[0].get_response().parameters["triton_final_response"].bool_param
    assert fourth[1].message() == "error at response 0"
    assert fifth[0].as_numpy("OUT").tolist() == [1]
    assert last[0].get_response().id == "after"


def test_a_client_that_goes_away_mid_stream_is_seen_by_the_model(server: ModelsvcProcess, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    stream = Stream(grpc_url(server))
    stream.client.async_stream_infer("repeat", inputs(10_000, 5), request_id="long", parameters={"record": str(record)})
    stream.take(3)  # it is streaming
    stream.close(cancel=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (record.exists() and "cancelled" in record.read_text()):
        time.sleep(0.05)
    assert record.read_text() == "cancelled\n"
    # the request counts as failed, and the server goes on serving
    check_many_in_flight(grpc_url(server))
    stats = server.model_stats("repeat")
    assert stats["inference_stats"]["fail"]["count"] >= 1
    assert sum(entry["cancel"]["count"] for entry in stats["response_stats"].values()) >= 1


def test_statistics_count_each_response_as_triton_does(server: ModelsvcProcess) -> None:
    before = server.model_stats("repeat_async")
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat_async", inputs(3, error_at=1, batched=False), request_id="s")
        stream.client.async_stream_infer(
            "repeat_async", inputs(0, batched=False), request_id="empty", enable_empty_final_response=True
        )
        stream.take(4)
    finally:
        stream.close()
    after = server.model_stats("repeat_async")
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 2

    def count(stats: dict[str, Any], index: str, kind: str) -> int:
        return int(stats["response_stats"].get(index, {}).get(kind, {}).get("count", 0))

    assert count(after, "0", "success") == count(before, "0", "success") + 1
    assert count(after, "0", "empty_response") == count(before, "0", "empty_response") + 1
    assert count(after, "1", "fail") == count(before, "1", "fail") + 1
    assert count(after, "2", "success") == count(before, "2", "success") + 1
    assert after["response_stats"]["2"]["compute_infer"]["ns"] > 0
    # gRPC ModelStatistics carries the same response_stats
    grpc_stats = grpcclient.InferenceServerClient(grpc_url(server)).get_inference_statistics("repeat_async")
    assert set(grpc_stats.model_stats[0].response_stats) == set(after["response_stats"])


def test_sending_after_the_final_flag_raises_tritons_error(server: ModelsvcProcess, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer(
            "repeat", inputs(2), request_id="c", parameters={"record": str(record), "check_closed": True}
        )
        stream.take(2)
    finally:
        stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (record.exists() and record.read_text().endswith("\n")):
        time.sleep(0.05)  # the file exists from the model's open(), before its line is written
    assert record.read_text() == CLOSED + "\n"


def test_unary_calls_are_refused_as_triton_refuses_them(server: ModelsvcProcess) -> None:
    client = grpcclient.InferenceServerClient(grpc_url(server))
    with pytest.raises(InferenceServerException) as grpc_refusal:
        client.infer("repeat", inputs(1))
    assert grpc_refusal.value.status() == "StatusCode.UNIMPLEMENTED"
    assert grpc_refusal.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    http = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("N", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.int32))
    with pytest.raises(InferenceServerException) as http_refusal:
        http.infer("repeat", [tensor])
    assert http_refusal.value.status() == "501"
    assert http_refusal.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"


def test_a_bad_request_gets_one_error_and_the_stream_goes_on(server: ModelsvcProcess) -> None:
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat", inputs(1, batched=False), request_id="bad")
        ((result, error),) = stream.take(1)
        stream.client.async_stream_infer("repeat", inputs(2), request_id="good")
        good = stream.take(2)
    finally:
        stream.close()
    assert result is None
    assert "unexpected shape for input 'N'" in error.message()
    assert by_request(good)["good"] == [([0], False), ([1], True)]


REFUSED_BLS = (
    "Model repeat is using the decoupled transaction policy: call it with 'decoupled=True' in BLS 'exec' or "
    "'async_exec', or over a gRPC stream (ModelStreamInfer)"
)


def bls_answers(http_url: str) -> list[tuple[list[int], list[bytes]]]:
    """What ``bls_repeat`` got from ``repeat`` through exec / async_exec(decoupled=True), for a few requests."""
    client = httpclient.InferenceServerClient(http_url)
    answers = []
    for n, error_at, run_async in ((3, 1, 0), (3, 1, 1), (0, -1, 0), (2, -1, 1), (1, -1, 2)):
        tensors = []
        for name, value in (("N", n), ("ERROR_AT", error_at), ("ASYNC", run_async)):
            tensor = httpclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            tensors.append(tensor)
        result = client.infer("bls_repeat", tensors)
        answers.append((result.as_numpy("OUT").tolist(), result.as_numpy("ERRORS").tolist()))
    return answers


def test_bls_requests_to_a_decoupled_model_iterate_its_responses(server: ModelsvcProcess) -> None:
    assert bls_answers(server.url) == [
        ([0, 2], [b"error at response 1"]),
        ([0, 2], [b"error at response 1"]),
        ([-1], []),  # the final flag without a response: an empty last response
        ([0, 1], []),
        ([], [REFUSED_BLS.encode()]),  # exec() without decoupled=True
    ]


RETURNED = (
    "Failed to process the request(s) for model 'repeat_0_0', message: Python model 'repeat_0_0' is using the "
    "decoupled mode and the execute function must return None."
)


def test_a_model_that_breaks_the_contract_ends_its_streams_with_an_error(server: ModelsvcProcess) -> None:
    """execute() returning responses: Triton's error. A sender dropped without its final flag (Triton 2.51 sends
    nothing at all): an error names the model, so that the stream ends."""
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat", inputs(-2), request_id="returns")
        ((_, returned),) = stream.take(1)
        stream.client.async_stream_infer("repeat", inputs(-1), request_id="drops")
        ((_, dropped),) = stream.take(1)
        stream.client.async_stream_infer("repeat", inputs(1), request_id="after")
        ((after, _),) = stream.take(1)
    finally:
        stream.close()
    assert returned.message() == RETURNED
    assert dropped.message() == "model 'repeat' ended the request without sending the final flag"
    assert after.get_response().id == "after"


def test_a_stream_mixes_decoupled_and_ordinary_models(server: ModelsvcProcess) -> None:
    """bls_repeat is not decoupled: its one answer, final, does not wait for a slow decoupled request before it."""
    tensors = []
    for name, value in (("N", 2), ("ERROR_AT", -1), ("ASYNC", 0)):
        tensor = grpcclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        tensors.append(tensor)
    stream = Stream(grpc_url(server))
    try:
        stream.client.async_stream_infer("repeat", inputs(4, 30), request_id="slow")
        stream.client.async_stream_infer("bls_repeat", tensors, request_id="ordinary")
        answers = stream.take(5)
    finally:
        stream.close()
    order = [result.get_response().id for result, _ in answers]
    assert order[-1] == "slow", order  # the ordinary answer came before the slow request's last response
    ordinary = answers[order.index("ordinary")][0]
    assert ordinary.as_numpy("OUT").tolist() == [0, 1]
    assert ordinary.get_response().parameters["triton_final_response"].bool_param
    assert by_request([a for a in answers if a[0].get_response().id == "slow"])["slow"] == [
        ([i], i == 3) for i in range(4)
    ]


def test_the_response_sender_checks_its_arguments_as_tritons_does() -> None:
    from modelsvc.backends import python_utils as pb_utils

    sent: list[Any] = []
    sender = pb_utils.InferenceResponseSender(None, sent.append, "m")
    with pytest.raises(
        pb_utils.TritonModelException, match=re.escape("Unable to send response. Unsupported flag provided.")
    ):
        sender.send(pb_utils.InferenceResponse([]), flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="Inference Response object must be provided"):
        sender.send()
    sender.send(pb_utils.InferenceResponse([]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match=re.escape(CLOSED)):
        sender.send(pb_utils.InferenceResponse([]))
    assert len(sent) == 1  # the one response was checked; the final flag alone has nothing to check
    assert not sender.is_cancelled()


def sequence_counts(url: str) -> dict[str, list[tuple[list[int], bool]]]:
    """Two sequences of ``sequence_count`` interleaved on one stream: each request's responses."""

    def count(n: int) -> list[Any]:
        tensor = grpcclient.InferInput("N", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[n]], np.int32))
        return [tensor]

    stream = Stream(url)
    try:
        for step, (n, flags) in enumerate(((2, {"sequence_start": True}), (3, {}), (1, {"sequence_end": True}))):
            for sid in (11, 12):
                stream.client.async_stream_infer(
                    "sequence_count", count(n + sid - 11), request_id=f"{sid}-{step}", sequence_id=sid, **flags
                )
        return by_request(stream.take(2 + 3 + 1 + 3 + 4 + 2))
    finally:
        stream.close()


def test_a_decoupled_model_with_the_sequence_batcher(server: ModelsvcProcess) -> None:
    """Each request's responses count on from its sequence's last response."""
    seen = sequence_counts(grpc_url(server))
    assert [values for values, _ in seen["11-0"] + seen["11-1"] + seen["11-2"]] == [[i] for i in range(1, 7)]
    assert [values for values, _ in seen["12-0"] + seen["12-1"] + seen["12-2"]] == [[i] for i in range(1, 10)]
    assert [final for _, final in seen["12-1"]] == [False, False, False, True]
