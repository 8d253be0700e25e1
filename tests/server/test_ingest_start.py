"""Starting ``modelsvc serve --workers 2`` where a worker cannot serve: it ends as one process does, at once."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from modelsvc.tools import onnx_models as om
from tests.conftest import identity_config
from tests.server._ingest import workers_server

pytestmark = pytest.mark.integration


def test_a_port_taken_ends_the_server_as_one_process_does(tmp_path: Path) -> None:
    """One process exits 1 when it cannot bind its port ("cannot open an endpoint"); its workers could not either,
    and the engine must not start them again and again (nor say it serves after START_TIMEOUT_S with none)."""
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = workers_server(tmp_path)
        server.http_port = taken.getsockname()[1]
        server.start()
        try:
            assert server.wait_exit(20) == 1
        finally:
            server.terminate()
    log = server.log()
    assert "address already in use" in log
    assert "starting it again" not in log
