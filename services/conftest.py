"""Fixtures for the example services' tests: the model built once, the services in-process or as real pairs."""

from __future__ import annotations

import os

# The tests start servers with subprocess and a preexec_fn, that is fork then exec, from a process whose gRPC
# clients may be busy on other threads. gRPC's fork handlers then run in the child and can abort it before
# exec ("epoll_wait error: Bad file descriptor"). The children exec at once and need none of that.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from logicd import create_app, load_config, load_service
from services import build
from tests._server import LogicdProcess, ModelsvcProcess

HERE = Path(__file__).resolve().parent


#: the time the first test that needs the built model gets: building it (when a previous run has not) takes about
#: 15 s at fp32, and minutes where the classifier's default is calibrated int8 (a CPU with VNNI or AMX, 2 cores)
BUILD_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def built() -> None:
    """Export the model and copy the tokenizer if a previous run has not (once)."""
    build.build()
    assert not build.missing(), build.missing()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test that uses ``built`` builds the model: it gets BUILD_TIMEOUT_S (its own timeout if longer)."""
    for item in items:
        if "built" in getattr(item, "fixturenames", ()):
            own = item.get_closest_marker("timeout")
            if own is None or (own.args and own.args[0] < BUILD_TIMEOUT_S):
                item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))
            return


def embedded_client(service: str) -> TestClient:
    """The service's app on an in-process model service (``model_service.url: embedded``), not started yet."""
    folder = HERE / service
    env = {"LOGICD_MODEL_SERVICE__URL": "embedded", "LOGICD_MODEL_SERVICE__MODEL_REPOSITORY": "./model_repository"}
    config = load_config(folder / "service.yaml", env)
    return TestClient(create_app(load_service(config, folder), config), timeout=60)


class Pair:
    """A service as it runs in production: ``modelsvc serve`` and ``logicd serve`` in two processes."""

    def __init__(self, service: str) -> None:
        folder = HERE / service
        self.model = ModelsvcProcess(folder / "model_repository")
        self.logic: LogicdProcess | None = None
        self.folder = folder

    def __enter__(self) -> Pair:
        self.model.start().wait_ready(120)
        try:
            self.logic = LogicdProcess(self.folder, self.model.base).start().wait_ready(120)
        except BaseException:
            self.model.terminate()
            raise
        return self

    @property
    def base(self) -> str:
        assert self.logic is not None
        return self.logic.base

    def __exit__(self, *exc: object) -> None:
        try:
            if self.logic is not None:
                self.logic.terminate()
        finally:
            self.model.terminate()


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest, built: None) -> Iterator[Pair]:
    """The pair of the service named by the test module's ``SERVICE``."""
    with Pair(request.module.SERVICE) as running:
        yield running
