"""Decoupled models through ingest workers (``--workers 2``): the tests of tests/engine/test_decoupled.py again.

A worker passes a gRPC stream whole to the engine's own gRPC door, so a stream's requests reach one engine that
holds the model's state; the responses come back as the model sends them, errors and cancellation included.
The sequence batcher's tests through workers are in test_ingest_sequence.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._server import ModelsvcProcess
from tests.engine.test_decoupled import *  # noqa: F403
from tests.engine.test_decoupled import REPOSITORY
from tests.server._ingest import workers_server

del test_the_response_sender_checks_its_arguments_as_tritons_does  # noqa: F821 (no server: ran there)


@pytest.fixture(scope="module")
def server() -> Iterator[ModelsvcProcess]:
    with workers_server(REPOSITORY, "--grpc-address", "127.0.0.1") as proc:
        yield proc
