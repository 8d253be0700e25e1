"""``logicd plan`` and the numbers it is given: every bad one refused with one line naming the field and exit 2
(the command run as a user runs it), large ones planned in closed form. How fast 10^9 requests/s plans is measured
by loadtests/plan_scale.py, not here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from logicd._cli import main
from logicd.plan import PlanError, Sensitivity, example_plan, parse_plan, plan_all

ROOT = Path(__file__).resolve().parents[2]
WRITEUP = example_plan("accelerators")


def edited(old: str, new: str) -> str:
    assert old in WRITEUP, old
    return WRITEUP.replace(old, new, 1)


BAD = [
    ("peak_rps: 20  ", "peak_rps: .inf", r"services\[0\] \(doc-classifier\)\.peak_rps: inf is not a finite number"),
    ("capacity: {rps: 4}", "capacity: {rps: .nan}", r"\(doc-classifier\)\.logic\.capacity\.rps: nan is not a finite"),
    ("price_per_hour: 0.22,", "price_per_hour: -0.22,", r"node_types\[3\] \(inf1\.xlarge\)\.price_per_hour: expected"),
    ("vcpus: 4,  memory: 8Gi,", "vcpus: 4, memory: 8Gi, allocatable: {cpu: 3920, memory: 7Gi},",
     r"node_types\[3\] \(inf1\.xlarge\)\.allocatable\.cpu: 3920 CPUs is more than the node's 4 vCPUs .*'3920m'"),
    ("vcpus: 4,  memory: 8Gi,", "vcpus: 4, memory: 8Gi, allocatable: {cpu: 3920m, memory: 9Gi},",
     r"allocatable\.memory: 9Gi is more than the node's memory 8Gi"),
    ("resources: {cpu: 1, memory: 2Gi}", "resources: {cpu: 1e400, memory: 2Gi}",
     r"logic\.resources\.cpu: a CPU quantity is a finite number, got '1e400'|logic\.resources\.cpu: inf is not"),
    ("resources: {cpu: 1, memory: 2Gi}", "resources: {cpu: 1, memory: 99999999999999999999Gi}",
     r"logic\.resources\.memory: a memory quantity '99999999999999999999Gi' is beyond any node"),
    ("headroom: 0.25", "headroom: 1", r"cluster\.headroom: expected `float` < 1"),
    ("peak_rps: 20  ", "peak_rps: 1e12", r"services\[0\] \(doc-classifier\): doc-classifier/model: .* asks for "
     r"1\.33e\+21 pods, more than the 1e\+18"),  # at 1e-9 documents/s per pod (below); 1e12 alone plans
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "expected"), BAD, ids=[b[1] for b in BAD])
def test_each_bad_number_is_one_line_and_exit_2(
    old: str, new: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    text = edited(old, new)
    if "1e12" in new:
        text = text.replace("capacity: {rps: 1, p50_ms", "capacity: {rps: 1e-9, p50_ms")
    plan.write_text(text)
    assert main(["plan", str(plan), "--summary"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"logicd plan: {plan}: ")
    assert re.search(expected, err), err


def test_the_command_refuses_without_a_traceback(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(edited("peak_rps: 20  ", "peak_rps: .inf"))
    done = subprocess.run([sys.executable, "-m", "logicd", "plan", str(plan)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == f"logicd plan: {plan}: services[0] (doc-classifier).peak_rps: inf is not a finite " \
        "number: give the figure itself"  # fmt: skip


@pytest.mark.parametrize("peak", ["1e7", "1e9", "1e12"])
def test_large_traffic_plans_in_closed_form(peak: str) -> None:
    """10^7 to 10^12 documents/s (written as YAML 1.2 floats): the pods are counted exactly, the nodes held as a
    few groups, and the cost is the nodes' price."""
    p = plan_all(parse_plan(edited("peak_rps: 20  ", f"peak_rps: {peak}"), "plan.yaml"), ROOT, sensitive=True)
    split = p.option("split-packed@inferentia")
    model = next(d for d in split.deployments if d.pod.service == "doc-classifier" and d.pod.half == "model")
    assert model.peak == -(-int(float(peak)) * 4 // 3)  # ceil(peak / (1 x 0.75))
    assert sum(n.pods.get(model.pod, 0) * n.count for n in split.nodes_peak) == model.peak
    assert len(split.nodes_peak) < 40
    assert split.cost_peak == pytest.approx(sum(n.shape.price * n.count for n in split.nodes_peak))
    assert split.cost_peak >= model.peak * 0.22


def test_the_no_fit_message_names_only_the_types_the_pod_may_use() -> None:
    """A model pod for Inferentia that no inf1.xlarge holds: the message names inf1.xlarge's room, not that of a
    larger node type the pod may not use."""
    text = edited("resources: {cpu: 1, memory: 3Gi, accelerators: {aws.amazon.com/neuron: 1}}",
                  "resources: {cpu: 6, memory: 3Gi, accelerators: {aws.amazon.com/neuron: 1}}")  # fmt: skip
    with pytest.raises(PlanError) as info:
        plan_all(parse_plan(text, "plan.yaml"), ROOT, "plan.yaml", sensitive=False)
    message = str(info.value)
    assert message.startswith("plan.yaml: services[0] (doc-classifier): doc-classifier/model: a pod requests cpu 6")
    assert "(only ['inf1.xlarge'] allowed); the largest it may use, inf1.xlarge, leaves pods cpu 3420m" in message
    assert "c6i" not in message
    assert "g4dn" not in message


def test_a_plan_near_the_limit_plans_though_its_sweeps_pass_it() -> None:
    """10^12 documents/s at 10^-5 per pod is 1.3 x 10^17 pods: planned; at 10x the traffic (past 10^18 pods) that
    option has no cost in the table instead of the plan being refused."""
    text = edited("peak_rps: 20  ", "peak_rps: 1e12")
    text = text.replace("capacity: {rps: 1, p50_ms", "capacity: {rps: 1e-5, p50_ms")
    p = plan_all(parse_plan(text, "plan.yaml"), ROOT, sensitive=True)
    assert p.option("split-packed@inferentia").cost_peak > 1e16
    assert isinstance(p.sensitivity, Sensitivity)
    row = p.sensitivity.table["split-packed@inferentia"]
    assert row[p.sensitivity.levels.index("1x peak")] == p.option("split-packed@inferentia").cost_peak
    assert row[p.sensitivity.levels.index("10x peak")] is None
