"""loadtests/ingest: the channel's benchmark in one process, the table's ratios from rounds, and a tiny real run of
the servers' benchmark where perf_analyzer runs (not on CI, which lacks its libraries)."""

from __future__ import annotations

import argparse
import re

import pytest

from loadtests.harness import _perf
from loadtests.ingest import bench, channel


def test_the_channel_benchmark_prints_both_paths_and_their_difference(capsys: pytest.CaptureFixture[str]) -> None:
    assert channel.main(["--requests", "400", "--rounds", "1", "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^(direct|link|channel's Python) \| ([\d.-]+)", out, re.M))
    assert set(rows) == {"direct", "link", "channel's Python"}
    assert float(rows["direct"]) > 0
    assert float(rows["link"]) > 0
    assert "flags=" in out  # the CPU's flags beside the table


def test_the_table_takes_each_rounds_ratio_against_the_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {  # (infer/s, engine us, workers us) per round
        ("identity", 0): [(1000.0, 100.0, 0.0), (2000.0, 200.0, 0.0)],
        ("identity", 1): [(900.0, 40.0, 70.0), (1000.0, 50.0, 80.0)],
    }
    bench._table(rows, ["identity"], [0, 1], argparse.Namespace(concurrency=8, rounds=2))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("identity |")]
    assert lines[0] == "identity | 0 | 1500 | 150 | 0 | 150 | - | -"
    # engine / one process: 0.40 and 0.25 -> median 0.33; infer/s: 0.9 and 0.5 -> 0.70
    assert lines[1] == "identity | 1 | 950 | 45 | 75 | 120 | 0.33 | 0.70"


@pytest.mark.skipif(_perf.perf_analyzer_problem() is not None, reason="perf_analyzer cannot run here")
def test_a_tiny_real_run_measures_both_servers(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--workers", "0,1", "--models", "identity", "--rounds", "1", "--seconds", "1", "--concurrency", "2"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"^identity \| 0 \| \d+ \| \d+ \| 0 \|", out, re.M), out
    assert re.search(r"^identity \| 1 \| \d+ \| \d+ \| \d+ \| \d+ \| [\d.]+ \| [\d.]+$", out, re.M), out
