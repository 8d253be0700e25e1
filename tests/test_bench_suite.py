"""loadtests/bench_suite.py: the table of ratios, a peer that is not installed, and a quick run of the cheap
benchmarks (dynamic batching on/off, doc_classifier pair vs the naive service) against real processes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import _servers, bench_suite
from tests._server import ROOT


def test_table_has_one_line_per_row_and_dashes_for_missing_ratios() -> None:
    rows = [
        bench_suite.Row("dynamic batching on / off", "700 infer/s", "470 infer/s", 1.4893, "c=8"),
        bench_suite.Row("modelsvc / Triton 2.51 (identity)", "-", "not installed", None, "pip install nvidia-pytriton"),
    ]
    lines = bench_suite.format_table(rows).splitlines()
    assert lines[0] == "| benchmark | modelsvc side | other side | ratio | command/notes |"
    assert len(lines) == 4
    assert "| 1.49 |" in lines[2]
    assert "| not installed | - |" in lines[3]


def test_a_peer_that_is_not_installed_gives_a_row_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_servers, "pytriton_dir", lambda: None)
    monkeypatch.setattr(bench_suite, "mlserver_executable_or_none", lambda: None)
    settings = bench_suite.Settings.quick("python")
    server = _servers.ServerProcess("unused", ["true"], 0)  # never started: no peer, no load
    for bench in (bench_suite.bench_triton, bench_suite.bench_mlserver):
        row = bench(server, tmp_path, settings)
        assert row.other == "not installed"
        assert row.ratio is None


def test_unknown_benchmark_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_suite.main(["--only", "batching,warp"])
    assert "unknown benchmark(s) warp" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_quick_run_gives_finite_ratios_and_agreeing_labels(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_suite", "--quick", "--only", "batching,pair", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=170,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| benchmark | modelsvc side | other side | ratio | command/notes |" in run.stdout
    table = json.loads(out.read_text())
    assert table["command"].startswith("python -m loadtests.bench_suite --quick")
    rows = {row["benchmark"]: row for row in table["rows"]}
    assert set(rows) == {"dynamic batching on / off", "pair / naive, long documents, c=4"}, rows
    for row in rows.values():
        assert row["ratio"] is not None, row
        assert math.isfinite(row["ratio"]), row
        assert row["ratio"] > 0, row
    pair = rows["pair / naive, long documents, c=4"]
    assert pair["extra"]["correct"] is True
    assert "labels agree 6/6" in pair["notes"]


def test_finding_mlserver_never_fails() -> None:
    """The MLServer row looks for tests/interop's environment without building it: a Path or None, no error
    (a refactor of that environment's marker once turned this row into FAILED)."""
    from loadtests import bench_suite

    found = bench_suite.mlserver_executable_or_none()
    assert found is None or found.name == "mlserver"
