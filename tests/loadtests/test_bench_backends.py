"""loadtests/backends/bench.py: choosing variants and parts, a variant whose extra is missing (a row, not a
failure), the tables and the verdict against the 3x target, and a quick run of the baseline against real
processes (its worker, modelsvc, logicd)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtests.backends import _variants as _backends_variants
from loadtests.backends import bench as bench_backends
from loadtests.backends._variants import Unavailable, Variant
from loadtests.suite._rows import Stats
from tests._server import ROOT


def test_only_picks_variants_and_parts_and_always_keeps_the_baseline() -> None:
    variants, parts = bench_backends._parse_only("openvino-int8,served")
    assert variants == ["onnxruntime-fp32", "openvino-int8"]
    assert parts == ["served"]
    variants, parts = bench_backends._parse_only("")
    assert variants == [v.key for v in bench_backends.VARIANTS]
    assert parts == list(bench_backends.PARTS)


def test_unknown_variant_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_backends.main(["--only", "openvino-fp8"])
    assert "unknown variant or part openvino-fp8" in capsys.readouterr().err


def test_a_missing_extra_gives_a_row_that_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "openvino" else real(name, *args)

    monkeypatch.setattr(_backends_variants.importlib.util, "find_spec", find_spec)
    with pytest.raises(Unavailable, match=r"not installed: pip install 'modelsvc\[openvino\]'"):
        _backends_variants.build_variant(Variant("openvino", "int8"), tmp_path, print)
    result = bench_backends.Result("openvino-int8", built=False, why="not installed: pip install 'modelsvc[openvino]'")
    table = bench_backends.variants_table([result], bench_backends.Settings.quick())
    assert "| openvino-int8 | not installed: pip install 'modelsvc[openvino]' | - |" in table


def _measured(name: str, cosine: float, agree: int, pair_ratio: float) -> bench_backends.Result:
    r = bench_backends.Result(name, built=True, cosine=cosine, labels=f"{agree}/6", labels_agree=agree, labels_total=6)
    r.inprocess = {"1x128": [40.0, 44.0, 42.0]}
    r.served = {"1x128": [30.0, 33.0, 31.0]}
    r.ratios = {"inprocess": {"1x128": [1.3, 1.4, 1.35]}, "served": {"1x128": [1.0, 1.0, 1.0]},
                "pair": {"c=4": [pair_ratio] * 3}}  # fmt: skip
    r.pair = [Stats(2.0 * pair_ratio, 900.0, 1500.0, 0)] * 3
    return r


def test_tables_show_medians_ratios_and_the_verdict_names_parity() -> None:
    settings = bench_backends.Settings(grid=((1, 128),))
    results = [
        _measured("onnxruntime-fp32", 1.0, 6, 1.0),
        _measured("openvino-int8", 0.9995, 6, 1.6),
        _measured("onnxruntime-int8", 0.95, 5, 2.1),
    ]
    grid = bench_backends.grid_table(results, settings).splitlines()
    assert grid[0] == "| variant | where | 1x128 |"
    assert "| onnxruntime-fp32 | in-process | 42.0 (1.35x) |" in grid
    assert "| onnxruntime-fp32 | served | 31.0 (1.00x) |" in grid
    table = bench_backends.variants_table(results, settings)
    assert "| openvino-int8 |  | 0 | 0.99950 | 6/6 | 3.20 | 900 | 1.60 | 1.60, 1.60, 1.60 |" in table
    line = bench_backends.verdict(results, "onnxruntime-fp32")
    assert line.startswith("target 3x on long documents: not met, the served default here (onnxruntime-fp32) at 1.00x")
    assert "; best other at parity openvino-int8 at 1.60x;" in line
    assert line.endswith("; fastest onnxruntime-int8 at 2.10x without parity (min cosine 0.95000, labels 5/6)")
    line = bench_backends.verdict(results, "openvino-int8")
    assert line.startswith("target 3x on long documents: not met, the served default here (openvino-int8) at 1.60x")
    assert "no other variant kept parity" in line


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_quick_run_of_the_baseline_gives_every_figure(tmp_path: Path) -> None:
    """The baseline's quick run, its header naming the CPU's flags; without the served default (on a CPU with
    VNNI or AMX, the classifier's calibrated int8, minutes to export on 2 cores), which a run measures unless
    ``--without-default``."""
    out = tmp_path / "bench.json"
    argv = ["--quick", "--only", "onnxruntime-fp32", "--json", str(out), "--without-default"]
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.backends", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=170,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| variant | where | 1x128 |" in run.stdout
    assert "\ncpu flags: " in run.stdout
    payload = json.loads(out.read_text())
    assert payload["command"].startswith("python -m loadtests.backends --quick")
    assert payload["cpu"].startswith("cpu flags: ")
    results = {r["variant"]: r for r in payload["results"]}
    assert set(results) == {"onnxruntime-fp32"}, results
    result = results["onnxruntime-fp32"]
    assert result["built"], result
    assert result["cosine"] > 0.9999, result  # today's export equals sentence-transformers
    assert result["labels"] == "6/6", result
    for part in ("inprocess", "served"):
        (value,) = result[part]["1x128"]
        assert math.isfinite(value), result
        assert value > 0, result
    assert result["ratios"]["served"]["1x128"] == [1.0]
    (pair,) = result["pair"]
    assert pair["per_s"] > 0, result
    assert pair["errors"] == 0, result
