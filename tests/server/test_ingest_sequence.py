"""Sequence models through ingest workers (``--workers 2``): the tests of tests/scheduler/test_sequence_models.py
again. A sequence's requests may arrive at different workers (one HTTP connection each, or a gRPC stream passed
whole to the engine): the engine's sequence batcher sees them all and keeps each sequence's state."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from modelsvc.tools.onnx_models import write_model
from tests._server import ModelsvcProcess
from tests.scheduler import test_sequence_models as single
from tests.scheduler.test_sequence_models import *  # noqa: F403
from tests.server._ingest import workers_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("seq") / "models"
    shutil.copytree(single.DATA, repo)
    model = single.onnx_sum_model()
    write_model(repo, "onnx_sum", model, single.ONNX_CONFIG)
    write_model(repo, "onnx_sum_auto", model, single.ONNX_AUTO_CONFIG)
    write_model(repo, "onnx_sum_debug", model, single.ONNX_DEBUG_CONFIG)
    with workers_server(repo) as proc:
        proc.wait_ready(60)
        yield proc
