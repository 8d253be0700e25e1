"""loadtests/gpu/bench_ingest.py without a GPU: its arguments, the plan that fits the grid in the budget, the table
and the issue's ratios on made-up cells, and one tiny real run (identity, ``--workers 1``, perf_analyzer) where
perf_analyzer runs. The GPU rows themselves run only on a GPU machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from loadtests.gpu import _ingest_plan as plan
from loadtests.gpu import bench_ingest as bench
from loadtests.harness._servers import ServerProcess


def test_the_defaults_are_the_issues_grid() -> None:
    args = bench.parse_args([])
    assert args.kinds == ["encoder", "identity"]
    assert args.workers == [0, 1, 4, 8, 15]
    assert args.concurrency == [1, 4, 16, 64, 128, 256]
    assert args.ref_concurrency == [4, 16]
    assert (args.encoder, args.tokens, args.layers, args.hidden) == ("gpu_fp16", 128, 6, 384)
    assert args.budget_s == 540
    assert args.window_ms is None
    assert not args.no_triton
    args = bench.parse_args(["--kinds", "identity", "--workers", "1,0,1", "--concurrency", "4,1", "--budget-s", "60"])
    assert (args.kinds, args.workers, args.concurrency, args.budget_s) == (["identity"], [0, 1], [1, 4], 60)


@pytest.mark.parametrize(
    "argv",
    [
        ["--kinds", "resnet"],
        ["--kinds", ""],
        ["--workers", "-1"],
        ["--concurrency", "0,4"],
        ["--concurrency", "a"],
        ["--hidden", "100"],
        ["--budget-s", "0"],
        ["--window-ms", "10"],
        ["--encoder", "tpu"],
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


# --- the plan -------------------------------------------------------------------------------------------------


def test_keep_order_keeps_the_ends_then_a_spread() -> None:
    assert plan.keep_order([1, 4, 16, 64, 128, 256]) == [256, 1, 16, 64, 4, 128]
    assert plan.keep_order([8, 2]) == [8, 2]
    assert plan.keep_order([5]) == [5]


def test_the_whole_grid_with_the_longest_window_that_fits() -> None:
    # 11 sweeps (5 servers x 2 kinds, Triton) of 6 concurrencies and the two 64-row cells: 68 cells
    got = plan.plan_grid(480, 11, [1, 4, 16, 64, 128, 256], 2)
    assert (got.window_ms, got.concurrencies, got.dropped) == (2000, [1, 4, 16, 64, 128, 256], [])
    assert got.estimate_s == pytest.approx(68 * (3 * 2.0 + plan.CELL_OVERHEAD_S))
    shorter = plan.plan_grid(300, 11, [1, 4, 16, 64, 128, 256], 2)
    assert shorter.window_ms == 1000
    assert not shorter.dropped
    assert shorter.estimate_s <= 300


def test_a_short_budget_drops_concurrencies_not_the_deadline() -> None:
    per_cell = plan.cell_seconds(min(plan.WINDOWS_MS))
    got = plan.plan_grid(100, 11, [1, 4, 16, 64, 128, 256], 2)
    assert got.window_ms == min(plan.WINDOWS_MS)
    assert got.concurrencies == [1, 16, 256]  # the ends, then the middle (on a log scale)
    assert got.dropped == [4, 64, 128]
    assert got.estimate_s == pytest.approx((11 * 3 + 2) * per_cell)
    assert got.estimate_s <= 100
    # nothing fits: still one concurrency, the largest (the deadline then skips what it cannot cover)
    assert plan.plan_grid(5, 11, [1, 4, 256], 2).concurrencies == [256]


def test_a_cell_the_budget_no_longer_covers_is_skipped() -> None:
    cell = plan.Cell("modelsvc", "identity", 1, 4)
    server = ServerProcess("never-started", ["true"], 1)
    bench.measure(Path("/nonexistent/perf_analyzer"), cell, server, Path("."), 2000, time.monotonic() + 3, None)
    assert cell.seq_per_s is None
    assert cell.error.startswith("skipped: the budget has ")


# --- the table and the ratios on made-up cells ------------------------------------------------------------------


def _cells() -> list[plan.Cell]:
    cells = []
    for w, rates in ((0, (2_500, 6_000)), (8, (2_600, 26_000))):
        cells += [
            plan.Cell("modelsvc", "encoder", w, c, seq_per_s=r, p99_ms=1.5) for c, r in zip((1, 64), rates, strict=True)
        ]
    cells.append(plan.Cell("modelsvc", "encoder", 0, 4, rows=64, seq_per_s=31_000.0, p99_ms=9.0))
    cells.append(plan.Cell("modelsvc", "encoder", 0, 16, rows=64, seq_per_s=32_000.0, p99_ms=30.0))
    for w, rates in ((0, (1_000, 8_000)), (8, (1_100, 40_000))):
        cells += [
            plan.Cell("modelsvc", "identity", w, c, seq_per_s=r, p99_ms=0.5)
            for c, r in zip((1, 64), rates, strict=True)
        ]
    cells.append(plan.Cell("triton", "identity", None, 1, seq_per_s=900.0, p99_ms=1.2))
    cells.append(plan.Cell("triton", "identity", None, 64, error="perf_analyzer exit 99: Failed to connect\nmore"))
    return cells


def test_ratios_against_their_targets() -> None:
    one_row, vs_triton, vs_one = plan.ratios(_cells())
    assert one_row.value == pytest.approx(26_000 / 32_000)
    assert one_row.verdict == "MET"
    assert "26,000 seq/s (modelsvc --workers 8, c=64) / 32,000 seq/s (modelsvc --workers 0, c=16, 64 rows)" in (
        one_row.detail
    )
    assert vs_triton.value == pytest.approx(40_000 / 900)
    assert vs_triton.verdict == "MET"
    assert vs_one.value == pytest.approx(5.0)
    assert vs_one.verdict == "MET"
    lower = [c for c in _cells() if not (c.kind == "identity" and c.workers == 8 and c.concurrency == 64)]
    assert plan.ratios(lower)[2].value == pytest.approx(1_100 / 8_000)
    assert plan.ratios(lower)[2].verdict == "NOT MET"


def test_a_missing_side_is_no_ratio() -> None:
    only_identity = [c for c in _cells() if c.kind == "identity" and c.server == "modelsvc"]
    one_row, vs_triton, vs_one = plan.ratios(only_identity)
    assert one_row.value is None
    assert one_row.verdict == "n/a"
    assert one_row.detail == "no figure for one-row, 64-row"
    assert vs_triton.value is None
    assert vs_triton.detail == "no figure for Triton"
    assert vs_one.value == pytest.approx(5.0)


def test_the_table_shows_each_cell_its_errors_and_the_ratios() -> None:
    text = plan.format_table(_cells(), [1, 64], ["machine: test", "GPU: none"])
    lines = text.splitlines()
    assert lines[:3] == ["machine: test", "GPU: none", ""]
    assert [part.strip() for part in lines[3].split("|")[1:-1]] == [
        "kind", "server", "rows", "c=1", "c=4", "c=16", "c=64", "best seq/s",
    ]  # fmt: skip
    rows = {tuple(part.strip() for part in line.split("|")[1:4]): line for line in lines if line.startswith("| ")}
    assert "6,000 (1.5 ms)" in rows[("encoder", "modelsvc --workers 0", "1")]
    assert "32,000 (30.0 ms)" in rows[("encoder", "modelsvc --workers 0", "64")]
    triton = rows[("identity", "triton 2.51 (python backend)", "1")]
    assert "900 (1.2 ms)" in triton
    assert "perf_analyzer exit 99: Fa..." in triton
    assert triton.rstrip().endswith("900 |")
    assert "- identity triton 2.51 (python backend) c=64 rows=1: perf_analyzer exit 99: Failed to connect" in text
    assert "- encoder one-row best / 64-row = 0.81 (target >= 0.8): MET; " in text
    assert "- identity --workers 8 / modelsvc one process = 5.00 (target >= 4): MET; " in text
    widths = {len(line) for line in lines if line.startswith("|")}
    assert len(widths) == 1  # the columns line up


# --- one tiny real run ---------------------------------------------------------------------------------------------


def test_a_tiny_real_run_writes_its_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem = bench.perf_problem(bench.find_perf_analyzer())
    if problem is not None:
        pytest.skip(problem)
    out = tmp_path / "cells.json"
    argv = ["--kinds", "identity", "--workers", "1", "--concurrency", "2", "--no-triton", "--budget-s", "60",
            "--window-ms", "300", "--json", str(out), "--output", str(tmp_path / "table.txt"),
            "--workdir", str(tmp_path / "work")]  # fmt: skip
    assert bench.main(argv) == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    (cell,) = doc["cells"]
    assert (cell["server"], cell["kind"], cell["workers"], cell["concurrency"], cell["rows"]) == (
        "modelsvc", "identity", 1, 2, 1,
    )  # fmt: skip
    assert cell["seq_per_s"] > 0
    assert cell["p99_ms"] > 0
    assert not cell["error"]
    assert doc["plan"]["window_ms"] == 300
    assert doc["plan"]["concurrencies"] == [2]
    assert [r["verdict"] for r in doc["ratios"]] == ["n/a", "n/a", "n/a"]
    table = (tmp_path / "table.txt").read_text()
    assert table.startswith("machine: ")
    assert "| identity | modelsvc --workers 1 |" in table
    assert (tmp_path / "work" / "modelsvc-workers1.log").exists()
