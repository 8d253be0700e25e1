"""Starting ``modelsvc serve --workers 2`` where a worker cannot serve: it ends as one process does, at once."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from modelsvc.tools import onnx_models as om
from tests._server import gone, wait_for
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


def test_workers_that_drained_on_the_groups_signal_are_not_started_again(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of the group: the workers drain and exit, and the engine, whose
    own SIGINT may be handled a moment after it sees them go (here: it was stopped meanwhile), must not start
    them again on its way out."""
    om.write_model(tmp_path, "identity", om.identity(), identity_config("identity"))
    server = workers_server(tmp_path).start().wait_ready()
    try:
        assert server.proc is not None
        engine = server.proc.pid
        workers = [int(pid) for pid in Path(f"/proc/{engine}/task/{engine}/children").read_text().split()]
        assert len(workers) == 2
        os.kill(engine, signal.SIGSTOP)
        try:
            for pid in workers:
                os.kill(pid, signal.SIGINT)
            wait_for(lambda: all(gone(pid) for pid in workers), "the workers to drain and exit", 20)
            os.kill(engine, signal.SIGINT)
        finally:
            os.kill(engine, signal.SIGCONT)
        assert server.wait_exit(30) == 0
    finally:
        server.terminate()
    assert "starting it again" not in server.log()
