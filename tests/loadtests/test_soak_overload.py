"""python -m loadtests.soak and python -m loadtests.overload end to end, briefly, against one real doc_classifier pair
(modelsvc serve + logicd serve) that both attach to: the tables and JSON have the expected rows and counts that add
up. No timing is asserted (the machine is shared); the figures themselves are in loadtests/README.md."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import overload, soak
from loadtests.harness._openloop import KINDS
from loadtests.harness._servers import ROOT, logicd_server, modelsvc_server
from services import build

FOLDER = ROOT / "services" / "doc_classifier"


@pytest.fixture(scope="module")
def attach() -> Iterator[list[str]]:
    """The pair, as the scripts' --url, --model-pid and --logic-pid arguments."""
    if build.missing():
        pytest.skip(f"the example services' model is not built: python -m services.build ({build.missing()})")
    with (
        modelsvc_server(FOLDER / "model_repository", 120.0) as model,
        logicd_server(FOLDER, model.base_url, 120.0) as logic,
    ):
        assert model.proc is not None
        assert logic.proc is not None
        yield ["--url", logic.base_url, "--model-pid", str(model.proc.pid), "--logic-pid", str(logic.proc.pid)]


def test_soak_prints_a_row_per_interval_and_its_verdicts(
    attach: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    argv = ["--minutes", "0.1", "--interval-s", "2", "--ramp-s", "1", "--words", "200", "--json", str(out)]
    assert soak.main([*argv, *attach]) in (0, 1)  # 1: a verdict failed, which a busy machine may cause
    data = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert data["ramp"], "no --capacity: the ramp measured it"
    assert "| clients |" in printed
    assert data["capacity"] == max(s["per_s"] for s in data["ramp"]) > 0
    intervals = data["intervals"]
    assert len(intervals) == 3
    assert sum(i["ok"] for i in intervals) > 0
    for i in intervals:
        for half in ("model", "logic"):
            assert i[half]["rss_mib"] > 10
            assert i[half]["fds"] > 3
            assert i[half]["threads"] >= 1
    rows = [line for line in printed.splitlines() if line.startswith("| 0.")]
    assert len(rows) == 3
    assert len(data["verdicts"]) == 7
    assert "| no errors " in printed
    assert data["pair_started"] is False


def test_overload_prints_each_phase_and_counts_every_request(
    attach: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "overload.json"
    argv = ["--phase-s", "2", "--capacity", "2", "--words", "200", "--deadline-s", "30", "--json", str(out)]
    assert overload.main([*argv, *attach]) in (0, 1)
    data = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert data["headers"] == {"Request-Timeout": "30"}
    assert [p["phase"] for p in data["phases"]] == ["70%", "300%", "70% again"]
    for p in data["phases"]:
        assert sum(p["counts"][k] for k in KINDS) == p["sent"]
        assert p["counts"]["lost"] == 0
        assert p["retry_after_503"] <= p["counts"]["503"]
    assert sum(p["counts"]["2xx"] for p in data["phases"]) > 0
    assert data["phases"][1]["sent"] > data["phases"][0]["sent"]  # 6 req/s against 1.4 (Poisson, 2 s)
    for name in ("| 70%  ", "| 300% ", "| 70% again "):
        assert name in printed
    assert "Request-Timeout: 30" in printed
    assert len(data["verdicts"]) == 6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "http://127.0.0.1:1"], "--url, --model-pid and --logic-pid go together"),
        (["--capacity", "0"], "--capacity must be a positive"),
        (["--deadline-s", "-1"], "--deadline-s must be a positive"),
    ],
)
def test_overload_refuses_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        overload.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
