"""loadtests/grid/bench.py (issue 16's grid against Triton): the plan, the tables, the queue-delay rule and the
ratios on made-up points, and one ``--quick`` run against real servers that checks the table's shape and that
its numbers are positive (not their values: the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.grid import bench as bench_grid
from loadtests.grid._measure import Point
from loadtests.grid._models import LARGE_DIM, Config
from loadtests.grid._report import Cell, grid_summary, grid_table, grpc_http_table, large_table, queue_verdict
from tests._server import ROOT

VARIANTS = ["modelsvc-python", "modelsvc-onnx", "triton-python"]


def _cell(
    mbs: int,
    delay: int,
    conc: int,
    proto: str = "http",
    infer: tuple[float, float, float] = (3, 2, 1),
    queue: float = 50.0,
    dim: int = 16,
) -> Cell:
    cell = Cell(Config(mbs, delay, dim), conc, proto, {"grid"})
    for v, x in zip(VARIANTS, infer, strict=True):
        cell.add(
            Point(v, "m", proto, conc, infer_per_s=x * 1000, p50_ms=0.2, p99_ms=0.5, avg_batch=2.0, queue_us=queue)
        )
    return cell


def _columns(line: str) -> int:
    return line.count("|") - 1


def test_the_plan_shares_the_curve_points_that_are_in_the_grid() -> None:
    args = bench_grid.build_parser().parse_args(["--protocol", "both"])
    bench_grid._defaults(args)
    cells = bench_grid.plan(args)
    grid = [c for c in cells if "grid" in c.parts]
    assert len(grid) == 2 * 3 * 3 * 2  # mbs x delay x concurrency x protocol
    curve = [c for c in cells if "curve" in c.parts]
    assert sorted({c.concurrency for c in curve}) == [1, 2, 4, 8, 16, 32, 64]
    shared = [c for c in curve if "grid" in c.parts]
    assert {(c.config, c.concurrency) for c in shared} == {(Config(64, 100), n) for n in (1, 8, 32)}
    large = [c for c in cells if "large" in c.parts]
    assert {(c.config.dim, c.config.mbs, c.concurrency) for c in large} == {(LARGE_DIM, 8, 1), (LARGE_DIM, 8, 8)}
    assert len({(c.config, c.concurrency, c.protocol) for c in cells}) == len(cells)


def test_flags_narrow_the_grid_and_refuse_unknown_models(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench_grid.build_parser().parse_args(
        ["--mbs", "8", "--delays", "0", "--concurrency", "1,32", "--parts", "grid", "--models", "onnx"]
    )
    bench_grid._defaults(args)
    cells = bench_grid.plan(args)
    assert [(c.config.mbs, c.config.delay_us, c.concurrency) for c in cells] == [(8, 0, 1), (8, 0, 32)]
    assert args.models == ["onnx"]
    with pytest.raises(SystemExit):
        bench_grid.build_parser().parse_args(["--models", "python,tensorrt"])
    assert "choose from python, onnx" in capsys.readouterr().err


def test_queue_rule_applies_only_with_a_delay_and_a_batch_that_cannot_fill() -> None:
    assert _cell(64, 100, 8).queue_rule_applies
    assert not _cell(64, 0, 8).queue_rule_applies  # no delay
    assert not _cell(8, 100, 8).queue_rule_applies  # 8 clients fill a batch of 8
    assert queue_verdict(_cell(8, 1000, 32), VARIANTS) == "n/a"
    assert queue_verdict(_cell(64, 100, 8, queue=110.0), VARIANTS).startswith("ok")
    late = _cell(64, 100, 8, queue=111.0)
    assert queue_verdict(late, VARIANTS).startswith("BREAKS")
    assert late.queue_breaks(VARIANTS) == ["modelsvc-python", "modelsvc-onnx"]  # Triton's queue is not judged


def test_ratios_are_medians_of_same_round_ratios() -> None:
    cell = Cell(Config(8, 0), 8, "http")
    for ms, tr in ((1000, 1000), (3000, 1000), (1200, 1000)):
        cell.add(Point("modelsvc-python", "m", "http", 8, infer_per_s=ms))
        cell.add(Point("triton-python", "m", "http", 8, infer_per_s=tr))
    cell.add(Point("modelsvc-python", "m", "http", 8, error="perf_analyzer failed"))
    cell.add(Point("triton-python", "m", "http", 8, infer_per_s=500))
    assert cell.ratio("modelsvc-python") == pytest.approx(1.2)
    assert cell.infer("modelsvc-python") == 1200
    assert cell.errors("modelsvc-python") == ["perf_analyzer failed"]


def test_tables_have_one_row_per_cell_and_as_many_columns_as_the_header() -> None:
    cells = [_cell(8, 0, 1, infer=(3, 2, 1)), _cell(64, 100, 8, infer=(1, 1, 2), queue=400.0)]
    lines = grid_table(cells, VARIANTS, "").splitlines()
    assert len(lines) == 2 + len(cells)
    assert {_columns(line) for line in lines} == {13}
    assert "| 3.00 | 2.00 |" in lines[2]
    assert "| 0.50 | 0.50 |" in lines[3]
    summary = grid_summary(cells, VARIANTS)
    assert "modelsvc-python/triton (http): min 0.50 (mbs64 d100 c8), median 1.75 over 2 cells" in summary
    assert "cells below 1.2x (http): 1 of 2: mbs64 d100 c8 (py 0.50, onnx 0.50)" in summary
    assert summary[-1].startswith("cells breaking the queue rule (http): 1 of 1 where it applies: mbs64 d100 c8")

    grpc = [_cell(8, 0, 1, "grpc", infer=(1.5, 2, 1))]
    table, below = grpc_http_table(cells + grpc, VARIANTS)
    assert table.splitlines()[2] == "| 8 | 0 | 1 | 0.50 | 1.00 | 1.00 |"
    assert below == ["modelsvc gRPC/HTTP cells below 0.8: 1: mbs8 d0 c1 py 0.50"]

    large = large_table([_cell(8, 0, 1, dim=LARGE_DIM, infer=(0.01, 0.02, 0.03))], VARIANTS, "").splitlines()
    assert len(large) == 2 + 3
    assert {_columns(line) for line in large} == {8}
    assert "| modelsvc-python | http | 1 | 10 | 42 |" in large[2]  # 10 infer/s x 4 MiB = 42 MB/s


def test_without_triton_its_columns_say_not_installed() -> None:
    cell = Cell(Config(8, 0), 1, "http", {"grid"})
    cell.add(Point("modelsvc-python", "m", "http", 1, infer_per_s=100.0, p99_ms=1.0))
    row = grid_table([cell], ["modelsvc-python", "triton-python"], "not installed").splitlines()[2]
    assert "| 100 | not installed | - |" in row
    assert (
        grid_summary([cell], ["modelsvc-python"])[0] == "modelsvc-python/triton (http): no ratio (Triton not measured)"
    )


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_quick_run_writes_a_table_json_and_plot_with_positive_numbers(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.grid", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=110,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "load generator: " in run.stdout
    doc = json.loads((tmp_path / "bench_grid.json").read_text())
    assert doc["command"].startswith("python -m loadtests.grid --quick")
    variants = doc["variants"]
    assert variants[:2] == ["modelsvc-python", "modelsvc-onnx"]
    [grid] = [c for c in doc["cells"] if "grid" in c["parts"]]
    assert (grid["max_batch_size"], grid["max_queue_delay_microseconds"], grid["concurrency"]) == (64, 100, 8)
    for v in variants:
        median = grid["median"][v]
        assert median["infer_per_s"] > 0, (v, median)
        assert median["p99_ms"] > 0, (v, median)
        assert median["avg_batch"] >= 1.0, (v, median)
        assert median["queue_us"] is not None, (v, median)
        assert median["queue_us"] >= 0, (v, median)
    if "triton-python" in variants:
        ratio = grid["ratio_to_triton"]["modelsvc-python"]
        assert ratio is not None
        assert math.isfinite(ratio)
        assert ratio > 0
    else:
        assert "not installed" in run.stdout
    text = (tmp_path / "bench_grid.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| 64 | 100 | 8 | http |")]
    assert len(table) == 1, text
    assert _columns(table[0]) == 13, text
    assert "cells breaking the queue rule (http):" in text
    curve = [c for c in doc["cells"] if "curve" in c["parts"]]
    assert sorted(c["concurrency"] for c in curve) == [1, 8]
    png = tmp_path / "bench_grid_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![throughput and p99 against concurrency](bench_grid_curve.png)" in text
