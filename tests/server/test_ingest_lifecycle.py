"""Queue policies through ingest workers (``--workers 2``): the tests of tests/engine/test_server_lifecycle.py that use
the session's repository. A request a queue policy refuses is refused by the engine; one whose client goes away
while it waits in the engine's queue is withdrawn (the worker tells the engine) and never runs. (The SIGTERM tests
there run with two workers as well.)"""

from __future__ import annotations

from tests.engine.test_server_lifecycle import (
    test_full_queue_answers_at_once_and_abandoned_request_never_runs,
    test_queue_timeout_rejects_at_its_deadline,
)
from tests.server._ingest import server

__all__ = [
    "server",
    "test_full_queue_answers_at_once_and_abandoned_request_never_runs",
    "test_queue_timeout_rejects_at_its_deadline",
]
