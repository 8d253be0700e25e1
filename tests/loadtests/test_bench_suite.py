"""loadtests/suite/bench.py: the table of ratios, a peer that is not installed, and a quick run of the cheap
benchmarks (dynamic batching on/off, doc_classifier pair vs the naive service) against real processes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.harness import _servers
from loadtests.suite import bench as bench_suite
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
    """The two cheap benchmarks as two runs at the same time (the suite leaves the second core idle; the test reads
    no number but for being finite and positive)."""
    runs = {}
    for only in ("batching", "pair"):
        out = tmp_path / f"{only}.json"
        argv = [sys.executable, "-m", "loadtests.suite", "--quick", "--only", only, "--json", str(out)]
        runs[only] = (subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT), out)
    done = {}
    try:
        for only, (proc, _) in runs.items():
            done[only] = proc.communicate(timeout=170)
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = {}
    for only, (proc, out) in runs.items():
        stdout, stderr = done[only]
        assert proc.returncode == 0, stdout + stderr
        assert "| benchmark | modelsvc side | other side | ratio | command/notes |" in stdout
        table = json.loads(out.read_text())
        assert table["command"].startswith(f"python -m loadtests.suite --quick --only {only}")
        rows.update({row["benchmark"]: row for row in table["rows"]})
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
    from loadtests.suite import bench as bench_suite

    found = bench_suite.mlserver_executable_or_none()
    assert found is None or found.name == "mlserver"
