"""loadtests/services: the table on made-up numbers, and one quick run against real servers with the current
checkout as its own base (--base-dir, so no git worktree is made)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.services import _checkouts as checkouts
from loadtests.services._load import emb_load
from loadtests.services.bench import format_table, rows_of
from loadtests.suite._rows import Stats

ROOT = Path(__file__).resolve().parents[2]


def test_rows_are_medians_of_sides_and_of_per_round_ratios() -> None:
    load = emb_load()
    stats = {
        "base": [Stats(10.0, 100.0, 200.0, 0), Stats(20.0, 50.0, 100.0, 0), Stats(30.0, 40.0, 90.0, 0)],
        "current": [Stats(12.0, 90.0, 210.0, 0), Stats(18.0, 60.0, 80.0, 0), Stats(33.0, 40.0, 90.0, 0)],
    }
    throughput, p50, p99 = rows_of(load, stats)
    assert (throughput.base, throughput.current) == (20.0, 18.0)
    assert throughput.rounds == pytest.approx([1.2, 0.9, 1.1])
    assert throughput.ratio == pytest.approx(1.1)  # the median of the per-round ratios, not 18 / 20
    assert p50.metric == "embedder p50 (ms)"
    assert p50.ratio == pytest.approx(1.0)
    assert "slower" in p99.note
    assert "rounds 1.05, 0.80, 1.00" in p99.note
    table = format_table([throughput, p50, p99]).splitlines()
    assert table[0] == "| metric | base | current | current/base | notes |"
    assert table[2].startswith("| embedder throughput (requests/s) | 20.00 | 18.00 | 1.10 |")


def test_given_base_must_be_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a checkout"):
        checkouts.given_base(tmp_path)


@pytest.mark.skipif(
    bool(checkouts.missing_built(ROOT)),
    reason=f"no ONNX Runtime build of {', '.join(checkouts.missing_built(ROOT))} when collected: "
    "run `python -m services.build --backend onnxruntime` first",
)
def test_quick_run_against_itself(tmp_path: Path) -> None:
    out = tmp_path / "services.json"
    argv = [sys.executable, "-m", "loadtests.services", "--quick", "--rounds", "1", "--seconds", "2",
            "--base-dir", str(ROOT), "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"modelsvc.__file__ = {ROOT / 'modelsvc' / '__init__.py'}" in done.stdout
    assert "labels agree 2/2" in done.stdout
    report = json.loads(out.read_text())
    metrics = [r["metric"] for r in report["rows"]]
    assert metrics == [
        f"{svc} {metric}"
        for svc, rate in (("doc_classifier", "docs/s"), ("embedder", "requests/s"))
        for metric in (f"throughput ({rate})", "p50 (ms)", "p99 (ms)")
    ]
    for row in report["rows"]:
        assert min(row["base"], row["current"], row["ratio"]) > 0, row
        assert len(row["rounds"]) == 1, row
    assert report["table"] in done.stdout
    assert report["command"].startswith("python -m loadtests.services --quick")
