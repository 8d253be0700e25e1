"""loadtests/plan_scale.py runs and prints its table (the CPU, one row per size with the nodes planned); its
timings are the script's to report, not checked here."""

from __future__ import annotations

import re

import pytest

from loadtests import plan_scale


def test_the_scale_benchmark_prints_a_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_scale.main(["--sizes", "10,1e9", "--repeat", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("logicd plan on logicd/plan/accelerators.yaml, traffic scaled; CPU: ")
    rows = [re.split(r"\s{2,}", line.strip()) for line in out[2:]]
    assert [r[0] for r in rows] == ["10", "1,000,000,000"]
    small, large = (int(r[1].replace(",", "")) for r in rows)
    assert large > 1000 * small  # the planned nodes grow with the traffic
    assert all(float(r[2]) > 0 and float(r[3]) > 0 and float(r[4]) > 0 for r in rows)


def test_scaling_keeps_each_services_share() -> None:
    import yaml

    data = yaml.safe_load(plan_scale.scaled(1e6))
    assert sum(s["peak_rps"] for s in data["services"]) == pytest.approx(1e6)
    assert all(s["average_rps"] <= s["peak_rps"] for s in data["services"])
