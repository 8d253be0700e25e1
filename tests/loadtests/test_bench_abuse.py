"""loadtests/abuse/bench.py: the command runs two of its attacks against modelsvc's own engine and prints the table
(the figures themselves are the benchmark's, not the test's: here only that each row is there and whole)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._server import ROOT

pytestmark = pytest.mark.integration


def test_the_command_prints_a_row_per_attack() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.abuse", "--servers", "h2", "--attacks", "continuation", "rapid_reset"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("machine: nproc=")  # the CPU and its flags beside the table
    rows = [line for line in run.stdout.splitlines() if line.startswith("| continuation |") or line.startswith(
        "| rapid_reset |"
    )]  # fmt: skip
    assert len(rows) == 2, run.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "modelsvc (own HTTP/2)"
        assert cells[5] == "GOAWAY ENHANCE_YOUR_CALM"  # how it stopped
        assert cells[6].startswith("+")
        assert cells[6].endswith(" MB")
        assert cells[7].startswith("yes")  # a well-behaved client served meanwhile
