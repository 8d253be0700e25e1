"""loadtests/padding/bench.py: the quick run on the python model that behaves like an accelerator (a real modelsvc,
16 clients, the three ways), the pieces it stands on (lengths, the config rewrites, answer decoding and the
token metrics), and the table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtests.padding import _load as _padding_load
from loadtests.padding import _models as _padding_models
from loadtests.padding import bench as bench_padding
from tests._server import ROOT


def test_lengths_are_log_uniform_from_8_to_256_with_a_mean_near_70_and_seeded() -> None:
    lengths = _padding_load.draw_lengths(20_000, seed=3)
    assert min(lengths) == 8
    assert max(lengths) == 256
    assert 66 < float(np.mean(lengths)) < 77  # (256 - 8) / ln 32 = 71.6
    assert 42 < float(np.median(lengths)) < 49  # sqrt(8 x 256) = 45.3
    assert _padding_load.draw_lengths(50, seed=3) == lengths[:50]
    assert _padding_load.draw_lengths(50, seed=4) != lengths[:50]


def test_padding_keys_are_removed_and_added_without_touching_the_rest() -> None:
    base = (_padding_models.MINILM_SOURCE / "config.pbtxt").read_text()
    plain = _padding_models.without_padding(base)
    assert "pad_inputs" not in plain
    assert "max_queue_delay_microseconds" in plain
    padded = _padding_models.with_padding(plain, _padding_models.MINILM_PADDING)
    assert padded.count("pad_inputs") == 1
    assert _padding_models.without_padding(padded).strip() == plain.strip()
    assert _padding_models.renamed(plain, "minilm_c").count('name: "minilm_c"') == 1


def test_a_binary_answer_is_decoded_without_its_http_headers() -> None:
    emb = np.arange(6, dtype=np.float32).reshape(1, 6)
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    header = {
        "model_name": "m",
        "outputs": [
            {"name": "e", "datatype": "FP32", "shape": [1, 6], "parameters": {"binary_data_size": emb.nbytes}},
            {"name": "ids", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": ids.nbytes}},
            {"name": "j", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
        ],
    }
    body = json.dumps(header).encode() + emb.tobytes() + ids.tobytes()
    out = _padding_load.decode_v2(body)
    assert np.array_equal(out["e"], emb)
    assert np.array_equal(out["ids"], ids)
    assert out["j"].tolist() == [[1, 2]]


def test_token_metrics_are_summed_over_versions_for_the_model_asked() -> None:
    page = "\n".join([
        "# TYPE modelsvc_batch_tokens_computed counter",
        'modelsvc_batch_tokens_computed{model="accel_c",version="1"} 300.0',
        'modelsvc_batch_tokens_computed{model="accel_c",version="2"} 100.0',
        'modelsvc_batch_tokens_computed{model="accel_cc",version="1"} 7.0',
        'modelsvc_batch_tokens_useful_total{model="accel_c",version="1"} 250.0',
    ])  # fmt: skip
    assert _padding_load.token_metrics(page, "accel_c") == {
        "modelsvc_batch_tokens_computed": 400.0,
        "modelsvc_batch_tokens_useful": 250.0,
    }


def test_an_unknown_part_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_padding.main(["--only", "accel,bert"])
    assert "unknown part(s) bert" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_quick_run_on_the_accelerator_model_checks_every_answer(tmp_path: Path) -> None:
    out = tmp_path / "padding.md"
    # 1.5 s windows, not quick's 3: still hundreds of checked answers per way on two loaded cores
    argv = ["--quick", "--only", "accel", "--seconds", "1.5", "--output", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.padding", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=170,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    table = out.read_text()
    assert table in run.stdout + "\n"
    lines = [line for line in table.splitlines() if line.startswith("| accel |")]
    assert len(lines) == 3
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        numbers = [cells[2], *cells[4:]]
        assert all(math.isfinite(float(c)) for c in numbers), line  # no "-" (missing) and no nan
    result = json.loads(out.with_suffix(".json").read_text())
    rows = {row["way"]: row for row in result["rows"]}
    assert set(rows) == {"a", "b", "c"}
    for way, row in rows.items():
        assert row["per_s"] > 0, way
        assert row["p50_ms"] <= row["p99_ms"], way
        assert row["wrong"] == row["errors"] == 0, row["first_problem"]
        assert row["answers"] > 0
        # every answer the server gave was decoded and checked by the client (the sum of the request's own ids,
        # and ids_out exactly as sent at the length sent)
        assert row["answers"] == row["server_answers"], way
    assert rows["a"]["computed_per_useful"] == pytest.approx(1.0)
    assert rows["b"]["computed_per_useful"] > 1.5  # 256 / a mean near 70 on most pools; 64 draws vary
    assert 1.0 <= rows["c"]["computed_per_useful"] < rows["b"]["computed_per_useful"]
    assert rows["b"]["avg_batch"] > 1.5
    assert any("target (c) >= 1.5 x the better of (a), (b)" in line for line in result["targets"])
