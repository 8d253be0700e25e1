"""The gRPC door's tests again, through ingest workers (``--workers 2``): the same calls, the same answers.

The tests are those of test_grpc_server.py that use the session's server, run against a server whose gRPC port
belongs to two worker processes: ModelInfer goes to the engine over the ingest channel, every other call to the
engine's own gRPC door.
"""

from __future__ import annotations

from tests.server import test_grpc_server as _single
from tests.server._ingest import server  # noqa: F401 (the fixture the imported tests use)
from tests.server.test_grpc_server import *  # noqa: F403

# the tests that start servers of their own, or start none, already ran in test_grpc_server.py
del test_traceparent_in_grpc_metadata_starts_the_request_trace  # noqa: F821
del test_unexpected_errors_show_nothing_of_themselves  # noqa: F821
del test_decoding_leaves_raw_bytes_uncopied  # noqa: F821
assert _single
