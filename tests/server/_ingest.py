"""What the ingest-worker tests share: the session's main repository served with ``--workers 2``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._server import ModelsvcProcess

WORKERS = "2"


def workers_server(repository: Path, *extra: str) -> ModelsvcProcess:
    return ModelsvcProcess(repository, "--workers", WORKERS, *extra)


@pytest.fixture(scope="module")
def server(main_repository: Path) -> Iterator[ModelsvcProcess]:
    """The main repository behind two ingest workers, as the session's ``server`` serves it in one process."""
    with workers_server(main_repository, "--http-max-input-size", "1048576") as proc:
        yield proc
