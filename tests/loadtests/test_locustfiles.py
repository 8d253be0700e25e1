"""The example services' locustfiles run against the real pairs (modelsvc + logicd): a few seconds of headless
locust with two users must send requests and see no failure, every answer's checks included.

The two services run at the same time (one module fixture): each run is mostly waiting (two users, a wait between
requests, locust's start-up), so together they take the time of one."""

from __future__ import annotations

import csv
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._server import ROOT
from tests._venvs import ensure_venv

pytestmark = pytest.mark.integration

LOCUST_VENV = ROOT / ".venv-locust"
LOCUST_REQUIREMENTS = ("locust==2.47.0",)
"""locust lives in its own environment: it wants geventhttpclient >= 2.5, tritonclient[http] 2.51 <= 2.0.2."""

SERVICES = ("doc_classifier", "embedder")
RUN_SECONDS = 5
RUN_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def locust() -> Path:
    return ensure_venv(LOCUST_VENV, LOCUST_REQUIREMENTS, "locust")


@pytest.fixture(scope="module")
def built() -> None:
    from services import build

    build.build()
    assert not build.missing(), build.missing()


@dataclass
class Run:
    """One service's locust run: its exit status, its output and its statistics file."""

    returncode: int
    output: str
    stats: Path


@pytest.fixture(scope="module")
def runs(built: None, locust: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Both services' pairs started together, then both locust runs at once; each test reads its own."""
    from services.conftest import Pair

    def start(service: str) -> Pair:
        return Pair(service).__enter__()

    with ExitStack() as stack:
        # the pool's threads live until the pairs are stopped: a server started with PR_SET_PDEATHSIG (the harness
        # ties each server to its parent) dies with the thread that started it, not only with the process
        pool = stack.enter_context(ThreadPoolExecutor(len(SERVICES)))
        futures = {service: pool.submit(start, service) for service in SERVICES}
        failures = []
        for future in futures.values():
            try:
                stack.push(future.result().__exit__)
            except BaseException as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
        started: dict[str, tuple[subprocess.Popen[str], Path, Path]] = {}
        for service, future in futures.items():
            folder = tmp_path_factory.mktemp(service)
            locustfile = ROOT / "loadtests" / "locust" / f"{service}.py"
            log = folder / "locust.log"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    [
                        *(str(locust), "-f", str(locustfile), "--host", future.result().base),
                        *("--headless", "-u", "2", "-r", "2", "-t", f"{RUN_SECONDS}s", "--stop-timeout", "20"),
                        *("--csv", str(folder / "stats"), "--only-summary", "--loglevel", "WARNING"),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=folder,  # the locustfile must find the repository by itself, as from any folder
                )
            stack.callback(_stop, proc)
            started[service] = (proc, log, folder / "stats_stats.csv")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        done = {}
        for service, (proc, log, stats) in started.items():
            returncode = proc.wait(max(deadline - time.monotonic(), 0.1))
            done[service] = Run(returncode, log.read_text(errors="replace"), stats)
        yield done


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("service", SERVICES)
def test_locustfile_runs_clean(service: str, runs: dict[str, Run]) -> None:
    run = runs[service]
    assert run.returncode == 0, run.output
    with run.stats.open(newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    total = rows["Aggregated"]
    assert int(total["Request Count"]) > 0, run.output
    assert int(total["Failure Count"]) == 0, run.output
    assert len(rows) >= 3, rows  # several kinds of request, besides the aggregate
