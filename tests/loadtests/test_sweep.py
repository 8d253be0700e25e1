"""The configuration sweep (loadtests.sweep): the grid, the config edit and the budget rule without a clock,
then a tiny real sweep over two configurations of the identity model."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from loadtests import loadgen, sweep
from modelsvc.tools import onnx_models as om
from tests.conftest import identity_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def parsed(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_grid_leaves_out_preferred_sizes_above_the_max_batch():
    points = sweep.grid([1, 2], [4, 16], [0, 500], [(), (8,)])
    assert len(points) == 2 * 2 * 2 + 2 * 1 * 2  # (8,) fits only max_batch_size 16
    assert sweep.Config(2, 16, 500, (8,)) in points
    assert sweep.Config(1, 4, 0, (8,)) not in points
    assert sweep.Config(2, 16, 500, (8,)).name == "i2_mbs16_d500_p8"


def test_apply_edits_fields_and_keeps_the_rest():
    base = parsed(identity_config("identity", extra="instance_group [ { count: 1 kind: KIND_CPU } ]"))
    out = sweep.apply(base, sweep.Config(3, 16, 2000, (4, 8)))
    assert out.max_batch_size == 16
    assert [g.count for g in out.instance_group] == [3]
    assert out.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(out.dynamic_batching.preferred_batch_size) == [4, 8]
    assert out.input[0].name == "INPUT0"
    assert base.max_batch_size == 8, "the original is left alone"
    plain = sweep.apply(parsed(identity_config("identity", extra="")), sweep.Config(2, 8, 0))
    assert plain.HasField("dynamic_batching")
    assert plain.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    with pytest.raises(ValueError, match="max_batch_size 0"):
        sweep.apply(parsed(identity_config("n", extra="", max_batch_size=0)), sweep.Config(1, 8, 0))


def fake(infer_per_s: float, p99_ms: float, errors: int = 0) -> loadgen.Result:
    return loadgen.Result(
        protocol="http", url="http://x", model="m", concurrency=1, request_rate=None, batch_size=1, seconds=1.0,
        requests=int(infer_per_s), throughput=infer_per_s, infer_per_s=infer_per_s,
        latency_ms={"p50": p99_ms / 2, "p90": p99_ms, "p95": p99_ms, "p99": p99_ms, "avg": p99_ms / 2,
                    "min": 0.0, "max": p99_ms},
        errors={"http 503": errors} if errors else {}, windows=1, stable=True,
    )  # fmt: skip


def test_choose_takes_the_highest_throughput_within_the_budget():
    a, b = sweep.Config(1, 8, 0), sweep.Config(2, 8, 500)
    rows = [
        sweep.Row(a, 1, fake(1000, 0.5)),
        sweep.Row(a, 8, fake(5000, 4.0)),  # fastest, over the budget
        sweep.Row(b, 4, fake(3000, 1.9)),  # the answer
        sweep.Row(b, 8, fake(4000, 1.0, errors=3)),  # within the budget but failing
        sweep.Row(b, 16, None, "RuntimeError: modelsvc exited"),
    ]
    chosen = sweep.choose(rows, 2.0)
    assert chosen is rows[2]
    assert sweep.choose(rows, 10.0) is rows[1]
    assert sweep.choose(rows, 0.1) is None
    assert sweep.choose([sweep.Row(a, 1, fake(100, 1.0)), sweep.Row(b, 1, fake(100, 0.5))], 2.0).config == b


def test_report_says_when_nothing_qualifies(tmp_path: Path):
    rows = [sweep.Row(sweep.Config(1, 8, 0), c, fake(100.0 * c, 5.0 * c)) for c in (1, 2)]
    out = tmp_path / "out"
    sweep.write_outputs(out, rows, None, 1.0, tmp_path, "m", "python -m loadtests.sweep ...")
    report = (out / "report.md").read_text()
    assert "No configuration qualifies" in report
    assert not (out / "config.pbtxt").exists()
    assert report.count("`i1_mbs8_d0`") == 2
    assert (out / "latency_vs_throughput.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.integration
def test_a_tiny_sweep_end_to_end(tmp_path: Path, capsys):
    repo = tmp_path / "repo"
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    out = tmp_path / "out"
    argv = ["--model-repository", str(repo), "--model", "identity", "--instance-count", "1",
            "--max-batch-size", "4,8", "--max-queue-delay-us", "0", "--concurrency", "1,4",
            "--latency-budget-ms", "1000", "--warmup-seconds", "0.1", "--window-seconds", "0.3", "--windows", "1",
            "-o", str(out), "-q"]  # fmt: skip
    assert sweep.main(argv) == 0
    assert "chosen:" in capsys.readouterr().out

    chosen = parsed((out / "config.pbtxt").read_text())
    base = sweep.read_config(repo / "identity")
    grid = sweep.grid([1], [4, 8], [0])
    assert any(chosen == sweep.apply(base, point) for point in grid)

    report = (out / "report.md").read_text()
    for point in grid:
        assert report.count(f"| `{point.name}` |") == 2, "one row per concurrency"
    assert report.count("**chosen**") == 1
    assert "![latency_vs_throughput](latency_vs_throughput.png)" in report

    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert len(rows) == 4
    assert all(float(r["infer_per_s"]) > 0 and float(r["avg_batch"]) >= 1 for r in rows)
    doc = json.loads((out / "results.json").read_text())
    assert doc["chosen"]["config"] in {p.name for p in grid}
    assert not any(math.isnan(r["result"]["throughput"]) for r in doc["rows"])
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["config_i1_mbs4_d0.png", "config_i1_mbs8_d0.png", "latency_vs_throughput.png",
                    "throughput_by_config.png"]  # fmt: skip
    assert all((out / name).read_bytes().startswith(PNG_SIGNATURE) for name in pngs)
