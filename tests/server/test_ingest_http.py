"""The HTTP door's tests again, through ingest workers (``--workers 2``): the same requests, the same answers.

The tests are those of test_http_infer.py and test_http_errors.py, run against a server whose ports belong to two
worker processes that send each inference to the engine process and forward every other request to it.
"""

from __future__ import annotations

from tests.server._ingest import server  # noqa: F401 (the fixture the imported tests use)
from tests.server.test_http_errors import *  # noqa: F403
from tests.server.test_http_infer import *  # noqa: F403
