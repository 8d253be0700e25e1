"""The example services' locustfiles run against the real pairs (modelsvc + logicd): a few seconds of headless
locust with two users must send requests and see no failure, every answer's checks included."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from tests._server import ROOT
from tests._venvs import ensure_venv

pytestmark = pytest.mark.integration

LOCUST_VENV = ROOT / ".venv-locust"
LOCUST_REQUIREMENTS = ("locust==2.47.0",)
"""locust lives in its own environment: it wants geventhttpclient >= 2.5, tritonclient[http] 2.51 <= 2.0.2."""


@pytest.fixture(scope="module")
def locust() -> Path:
    return ensure_venv(LOCUST_VENV, LOCUST_REQUIREMENTS, "locust")

RUN_SECONDS = 5


@pytest.fixture(scope="module")
def built() -> None:
    from services import build

    build.build()
    assert not build.missing(), build.missing()


@pytest.mark.parametrize("service", ["doc_classifier", "embedder"])
def test_locustfile_runs_clean(service: str, built: None, locust: Path, tmp_path: Path) -> None:
    from services.conftest import Pair

    locustfile = ROOT / "loadtests" / "locust" / f"{service}.py"
    prefix = tmp_path / "stats"
    with Pair(service) as pair:
        run = subprocess.run(
            [
                *(str(locust), "-f", str(locustfile), "--host", pair.base),
                *("--headless", "-u", "2", "-r", "2", "-t", f"{RUN_SECONDS}s", "--stop-timeout", "20"),
                *("--csv", str(prefix), "--only-summary", "--loglevel", "WARNING"),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,  # the locustfile must find the repository by itself, as from any folder
            timeout=90,
        )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    with (tmp_path / "stats_stats.csv").open(newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    total = rows["Aggregated"]
    assert int(total["Request Count"]) > 0, output
    assert int(total["Failure Count"]) == 0, output
    assert len(rows) >= 3, rows  # several kinds of request, besides the aggregate
