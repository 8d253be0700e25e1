"""Decoupled models on the grpcio gRPC engine (``--grpc-engine grpcio``): the same stream as on the default engine
(tests/engine/test_decoupled.py), and a client that goes away mid-stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._server import ModelsvcProcess
from tests.engine.test_decoupled import REPOSITORY, Stream, check_many_in_flight, grpc_url, inputs


@pytest.fixture(scope="module")
def server() -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(REPOSITORY, "--grpc-address", "127.0.0.1", "--grpc-engine", "grpcio") as proc:
        yield proc


def test_many_requests_in_flight_and_a_client_that_goes_away(server: ModelsvcProcess, tmp_path: Path) -> None:
    check_many_in_flight(grpc_url(server))
    record = tmp_path / "record.txt"
    stream = Stream(grpc_url(server))
    stream.client.async_stream_infer("repeat", inputs(10_000, 5), request_id="long", parameters={"record": str(record)})
    stream.take(3)
    stream.close(cancel=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (record.exists() and "cancelled" in record.read_text()):
        time.sleep(0.05)
    assert record.read_text() == "cancelled\n"
    check_many_in_flight(grpc_url(server))
