"""Decoupled models against a real Triton 2.51: the python models of tests/data/decoupled load on both servers and
stream the same responses over tritonclient's gRPC streaming (order, ``triton_final_response``, the empty final
response, errors mid-stream, send after the final flag, a client that goes away), and both refuse unary calls with
the same words and status."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.engine.test_decoupled import REPOSITORY, RETURNED, Stream, bls_answers, inputs

from ._triton import beside_modelsvc

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """(HTTP base URL, gRPC url) of a real Triton and of modelsvc, each serving a copy of tests/data/decoupled."""
    workdir = tmp_path_factory.mktemp("triton_decoupled")
    # Triton 2.51 waits its whole exit timeout (30 s) after BLS calls to a decoupled model, answered or not
    with beside_modelsvc(REPOSITORY, workdir, "--exit-timeout-secs", "2") as (triton, ours):
        yield {
            "triton": (triton.base_url, f"127.0.0.1:{triton.grpc_port}"),
            "modelsvc": (ours.base, f"127.0.0.1:{ours.grpc_port}"),
        }


def _wait_for(path: Path, text: str) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (path.exists() and text in path.read_text()):
        time.sleep(0.05)
    return path.read_text() if path.exists() else ""


def _stream(grpc_url: str, record: Path) -> list[Any]:
    """One stream's answers, each as (id, OUT, final marker, output names) or ("error", message)."""
    stream = Stream(grpc_url)
    try:
        stream.client.async_stream_infer("repeat", inputs(3, error_at=1), request_id="e")
        first = stream.take(3)  # its answers before the others': the order across requests is not the server's
        stream.client.async_stream_infer("repeat", inputs(0), request_id="z", enable_empty_final_response=True)
        stream.client.async_stream_infer("repeat", inputs(0), request_id="nothing")
        stream.client.async_stream_infer(
            "repeat_async", inputs(4, 2, batched=False), request_id="a", enable_empty_final_response=True
        )
        stream.client.async_stream_infer(
            "repeat", inputs(2), request_id="c", parameters={"record": str(record), "check_closed": True}
        )
        answers = first + stream.take(7)  # z: 1, nothing: 0, a: 4, c: 2
    finally:
        stream.close()
    shown: list[Any] = []
    for result, error in answers:
        if error is not None:
            shown.append(("error", error.message()))
            continue
        response = result.get_response()
        out = result.as_numpy("OUT")
        shown.append(
            (
                response.id,
                response.model_name,
                None if out is None else out.tolist(),
                response.parameters["triton_final_response"].bool_param,
                [o.name for o in response.outputs],
            )
        )
    return sorted(shown, key=repr)


def test_the_same_streams_on_both_servers(servers: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    seen = {}
    for name, (_, grpc_url) in servers.items():
        record = tmp_path / f"{name}.txt"
        seen[name] = (_stream(grpc_url, record), _wait_for(record, "closed"))
    assert seen["modelsvc"] == seen["triton"]
    assert seen["triton"][1] == "Unable to send response. Response sender has been closed.\n"


def test_a_client_that_goes_away_is_seen_by_the_model_on_both(
    servers: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    for name, (_, grpc_url) in servers.items():
        record = tmp_path / f"{name}-cancel.txt"
        stream = Stream(grpc_url)
        stream.client.async_stream_infer(
            "repeat", inputs(10_000, 5), request_id="long", parameters={"record": str(record)}
        )
        stream.take(3)
        stream.close(cancel=True)
        assert _wait_for(record, "cancelled") == "cancelled\n", name


def test_unary_calls_are_refused_alike(servers: dict[str, tuple[str, str]]) -> None:
    refusals = {}
    for name, (base, grpc_url) in servers.items():
        with pytest.raises(InferenceServerException) as grpc_refusal:
            tg.InferenceServerClient(grpc_url).infer("repeat", inputs(1))
        body = {"inputs": [{"name": "N", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
        http = httpx.post(f"{base}/v2/models/repeat/infer", json=body, timeout=10)
        refusals[name] = (grpc_refusal.value.status(), grpc_refusal.value.message(), http.status_code, http.json())
    assert refusals["modelsvc"] == refusals["triton"]


def test_bls_to_a_decoupled_model_alike(servers: dict[str, tuple[str, str]]) -> None:
    """The same responses through exec / async_exec(decoupled=True), the empty last one included. One known
    difference: Triton 2.51 leaves a response the called model failed out of the iterator, where its python
    backend's documentation (and modelsvc) yields it with has_error()."""
    answers = {name: bls_answers(base.removeprefix("http://")) for name, (base, _) in servers.items()}
    assert [values for values, _ in answers["modelsvc"]] == [values for values, _ in answers["triton"]]
    assert [errors for _, errors in answers["triton"]][:4] == [[], [], [], []]
    assert [errors for _, errors in answers["modelsvc"]][:4] == [[b"error at response 1"]] * 2 + [[], []]
    # exec() without decoupled=True: refused by both, in other words (Triton: "Model repeat - Error when running
    # inference: Model repeat is using the decoupled. The current BLS request call doesn't support ...")
    assert all(b"decoupled=True" in answers[name][4][1][0] for name in answers)


def test_execute_returning_responses_fails_alike(servers: dict[str, tuple[str, str]]) -> None:
    for name, (_, grpc_url) in servers.items():
        stream = Stream(grpc_url)
        try:
            stream.client.async_stream_infer("repeat", inputs(-2), request_id="returns")
            ((result, error),) = stream.take(1)
        finally:
            stream.close()
        assert result is None, name
        assert error.message() == RETURNED, name
