"""python -m loadtests.storm end to end, briefly, against a real doc_classifier pair (modelsvc serve + logicd serve):
every phase in the table and the JSON, each request counted once, Retry-After counted on the refusals, the machine
named. No timing is asserted (the machine is shared); the figures themselves are in loadtests/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests import storm
from tests.loadtests.test_soak_overload import attach  # noqa: F401 (the pair, a fixture)


def test_storm_prints_each_phase_and_counts_every_request(
    attach: list[str],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "storm.json"
    argv = [
        "--base-s", "2", "--clients", "8", "--storm-s", "2", "--words", "200", "--burst", "6",
        "--burst-max-words", "200", "--burst-deadline-s", "30", "--settle-s", "0.2", "--json", str(out),
    ]  # fmt: skip
    assert storm.main([*argv, *attach]) in (0, 1)  # 1: a verdict failed, which a busy machine may cause
    data = json.loads(out.read_text())
    printed = capsys.readouterr().out
    names = ["2 clients", "8 clients", "burst of 6", "burst of 6, deadline 30 s"]
    assert [p["phase"] for p in data["phases"]] == names
    for p in data["phases"]:
        assert p["sent"] == p["ok"] + p["refused"] + sum(p["other"].values()) > 0
        assert p["retry_after"] <= p["refused"]
        assert len(p["answered"]) == p["ok"]
    assert [p["sent"] for p in data["phases"][2:]] == [6, 6]  # a burst sends each document once
    assert data["phases"][0]["ok"] > 0
    rows = [line for line in printed.splitlines() if line.startswith("| 1 ")]
    assert [row.split("|")[2].strip() for row in rows] == names
    assert "cpu=" in printed
    assert "flags:" in printed
    assert len(data["verdicts"]) == 4


def test_a_burst_refused_at_the_budget_but_served_under_a_deadline_gets_a_hint() -> None:
    """The hint names the time the burst took under a deadline (what max_wait_s must exceed), and only shows when
    the burst was refused at the default budget while served whole under the deadline."""

    def phase(name: str, sent: int, ok: int, last_s: float) -> dict[str, object]:
        return {"phase": name, "sent": sent, "ok": ok, "refused": sent - ok, "last_s": last_s}

    refused = phase("burst of 64", 64, 3, 0.4)
    served = phase("burst of 64, deadline 30 s", 64, 64, 8.7)
    hint = storm.budget_hint([phase("2 clients", 40, 40, 12.0), refused, served])
    assert hint is not None
    assert "8.7 s" in hint
    assert "LOGICD_ADMISSION__MAX_WAIT_S" in hint
    assert storm.budget_hint([phase("burst of 64", 64, 64, 4.5), served]) is None  # nothing refused
    assert storm.budget_hint([refused]) is None  # no deadline run to tell how long it takes
    assert storm.budget_hint([refused, phase("burst of 64, deadline 30 s", 64, 60, 30.0)]) is None
