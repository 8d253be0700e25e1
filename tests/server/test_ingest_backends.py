"""The backend contract's served tests again, through ingest workers (``--workers 2``), for every backend here.

What each backend must do over HTTP and gRPC (test_backend_contract.py), on a server whose ports belong to two
worker processes: inference and batching across the workers' connections, errors naming the tensor or the inputs,
a model that failed to load reported with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._server import ModelsvcProcess
from tests.backends.test_backend_contract import (  # noqa: F401 (fixtures the imported tests use)
    case,
    http,
    repository,
    serve_contract,
    test_a_bad_request_is_invalid_argument_naming_the_tensor,
    test_a_mismatch_fails_only_its_own_requests_each_naming_its_own_shapes,
    test_a_model_whose_config_disagrees_is_unavailable_with_the_reason,
    test_concurrent_requests_are_batched,
    test_grpc_inference,
    test_http_inference_and_metadata,
    test_inputs_that_do_not_fit_each_other_are_invalid_argument_naming_them,
)
from tests.server._ingest import WORKERS


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ModelsvcProcess]:  # noqa: F811 (the fixture it takes)
    """As the contract's server, behind two workers."""
    yield from serve_contract(repository, "--workers", WORKERS)
