"""``logicd plan`` comparing accelerators in one run: the write-up's case (logicd/plan/accelerators.yaml: one
document service on Inferentia, on T4 with ONNX Runtime or TensorRT, or on CPUs, beside five CPU services), the
options per accelerator family, the cheapest per service and overall, and the break-even and crossover points,
each checked by planning again on either side of it; extended resources (Neuron, MIG) and the refusal of a model
whose capacity could belong to more than one accelerator."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest

from logicd._cli import main
from logicd.plan import PlanError, Planned, example_plan, parse_plan, plan_all, render_svg
from logicd.plan._cost import per_million, per_service
from logicd.plan._pack import expand
from logicd.plan._sensitivity import Sensitivity

ROOT = Path(__file__).resolve().parents[2]
WRITEUP = example_plan("accelerators")


def planned(text: str, sensitive: bool = False) -> Planned:
    return plan_all(parse_plan(text, "plan.yaml"), ROOT, "plan.yaml", sensitive=sensitive)


@pytest.fixture(scope="module")
def writeup() -> Planned:
    return planned(WRITEUP, sensitive=True)


def cost(text: str, option: str) -> float:
    return planned(text).option(option).cost_peak


def test_one_run_compares_every_accelerator(writeup: Planned) -> None:
    assert writeup.families == ["inferentia", "t4-ort", "t4-trt"]
    names = [o.name for o in writeup.options]
    for kind in ("monolith-per-gpu-node", "split-packed", "shared-model-service"):
        assert [n for n in names if n.startswith(kind)] == [f"{kind}@{f}" for f in writeup.families]
    assert names[0] == "cpu-only"
    c = {o.name: o.cost_peak for o in writeup.options if not o.unavailable}
    # the same service, three accelerators: the faster T4 build beats the slower, Inferentia beats both
    assert c["split-packed@inferentia"] < c["split-packed@t4-trt"] < c["split-packed@t4-ort"]
    assert c["split-packed@inferentia"] < c["cpu-only"]
    assert min(c, key=c.__getitem__) == "split-packed@inferentia"
    # each family's model pods on its own node type, with its own resource
    for family, node, resource in [("inferentia", "inf1.xlarge", "aws.amazon.com/neuron"),
                                   ("t4-trt", "g4dn.2xlarge", "nvidia.com/gpu")]:  # fmt: skip
        option = writeup.option(f"split-packed@{family}")
        model = next(d for d in option.deployments if d.pod.service == "doc-classifier" and d.pod.half == "model")
        assert dict(model.pod.accelerators) == {resource: 1}
        hosts = {n.shape.name for n in option.nodes_peak if model.pod in n.pods}
        assert hosts == {node}
        assert sum(n.pods.get(model.pod, 0) * n.count for n in option.nodes_peak) == model.peak
    assert writeup.option("cpu-only").nodes_peak
    assert not any(n.shape.accelerators for n in writeup.option("cpu-only").nodes_peak)


def test_cost_per_service_is_over_its_own_requests(writeup: Planned, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "logicd" / "plan" / "accelerators.yaml"
    assert main(["plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rps = {name: v["peak"] for name, v in data["per_service_rps"].items()}
    for o in data["options"]:
        if o["unavailable"]:
            continue
        services = o["per_service_at_peak"]
        assert sum(v["cost_per_hour"] for v in services.values()) == pytest.approx(o["cost_per_hour"]["peak"], abs=1e-3)
        for name, v in services.items():
            assert v["cost_per_million_requests"] == pytest.approx(v["cost_per_hour"] / (rps[name] * 3600) * 1e6, 1e-3)
    doc = {o["name"]: o["per_service_at_peak"]["doc-classifier"]["cost_per_hour"] for o in data["options"]
           if not o["unavailable"]}  # fmt: skip
    # the document service alone: Inferentia's nodes cost less than the T4s' even before packing
    assert doc["split-packed@inferentia"] < doc["split-packed@t4-trt"] < doc["split-packed@t4-ort"]
    split = writeup.option("split-packed@inferentia")
    assert per_service(split.nodes_peak)["doc-classifier"] == pytest.approx(doc["split-packed@inferentia"], abs=1e-3)
    assert per_million(1.0, 0) is None


def test_the_table_shows_per_service_and_the_cheapest(writeup: Planned, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "logicd" / "plan" / "accelerators.yaml"
    assert main(["plan", str(path), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "cheapest at peak: split-packed@inferentia" in out
    assert "$/hour per service at peak" in out
    assert "$/1M requests per service at peak (each over its own requests)" in out
    assert re.search(r"^  doc-classifier: split-packed@inferentia, \$[0-9.,]+/hour", out, re.M)
    assert "break-even against throughput per pod" in out
    assert re.search(r"doc-classifier/t4-trt: split-packed@t4-trt beats split-packed@inferentia \(\$[0-9.,]+/hour\) "
                     r"above [0-9.]+ document/s per pod \(measured 0.8\)", out)  # fmt: skip
    assert max(len(line) for line in out.splitlines() if "unavailable" in line) < 200


def _with_rps(text: str, variant: str, rps: float) -> str:
    block = text.index(f"- name: {variant}")
    at = text.index("capacity: {rps: ", block) + len("capacity: {rps: ")
    end = text.index(",", at)
    return text[:at] + repr(rps) + text[end:]


def test_the_break_even_is_where_the_costs_meet(writeup: Planned) -> None:
    """Planned again at the break-even throughput the T4 option costs no more than Inferentia's; 1 % below it, it
    costs more. Inferentia's own point is checked the same way, downward."""
    assert isinstance(writeup.sensitivity, Sensitivity)
    found = {b.variant: b for b in writeup.sensitivity.break_even}
    assert set(found) == {"inferentia", "t4-ort", "t4-trt"}
    trt = found["t4-trt"]
    assert (trt.alternative, trt.cheaper_now, trt.measured) == ("split-packed@inferentia", False, 0.8)
    assert trt.at is not None
    assert trt.at > trt.measured
    best = writeup.option("split-packed@inferentia").cost_peak
    assert trt.alternative_cost == best
    assert cost(_with_rps(WRITEUP, "t4-trt", trt.at), "split-packed@t4-trt") <= best + 1e-9
    assert cost(_with_rps(WRITEUP, "t4-trt", trt.at / 1.01), "split-packed@t4-trt") > best
    assert found["t4-ort"].at == pytest.approx(trt.at, rel=2e-3)  # the same pod and node: the same point
    inf = found["inferentia"]
    assert inf.cheaper_now
    assert inf.at is not None
    assert inf.at < inf.measured
    rival = writeup.option(inf.alternative).cost_peak
    assert cost(_with_rps(WRITEUP, "inferentia", inf.at), "split-packed@inferentia") <= rival + 1e-9
    assert cost(_with_rps(WRITEUP, "inferentia", inf.at / 1.01), "split-packed@inferentia") > rival


FIXED = """
node_types:
  - {name: cpu8, vcpus: 8, memory: 32Gi, price_per_hour: 0.4, allocatable: {cpu: 8, memory: 32Gi}}
  - {name: gpu8, vcpus: 8, memory: 32Gi, gpus: 1, price_per_hour: 1.0, allocatable: {cpu: 8, memory: 32Gi}}
cluster: {headroom: 0, min_replicas: 2, daemonsets: {cpu: 0, memory: 0Mi}, gpu_daemonsets: {cpu: 0, memory: 0Mi}}
services:
  - name: m
    kind: model
    peak_rps: PEAK
    latency_budget_ms: 100
    model:
      resources: {cpu: 7, memory: 8Gi, gpu: 1}
      capacity: {rps: 100}
      on_cpu: {resources: {cpu: 8, memory: 8Gi}, capacity: {rps: 10}}
"""


def test_traffic_crossovers_are_where_the_cheapest_changes() -> None:
    """Two GPU nodes at least (min_replicas) cost $2 where CPU nodes serve 10 req/s for $0.40: CPU only is
    cheaper until the traffic pays for the GPUs; planned again on either side, the order flips."""
    p = planned(FIXED.replace("PEAK", "10"), sensitive=True)
    assert isinstance(p.sensitivity, Sensitivity)
    (cross,) = p.sensitivity.crossovers
    assert (cross.below, cross.above) == ("cpu-only", "split-packed")
    over = 10 * cross.scale * 1.03
    under = 10 * cross.scale / 1.03
    at_over, at_under = planned(FIXED.replace("PEAK", f"{over}")), planned(FIXED.replace("PEAK", f"{under}"))
    assert at_over.option("split-packed").cost_peak * 1.02 < at_over.option("cpu-only").cost_peak
    assert at_under.option("split-packed").cost_peak >= at_under.option("cpu-only").cost_peak / 1.02
    row = p.sensitivity.table["cpu-only"]
    assert row[p.sensitivity.levels.index("1x peak")] == p.option("cpu-only").cost_peak
    assert row[p.sensitivity.levels.index("10x peak")] == planned(FIXED.replace("PEAK", "100")).option(
        "cpu-only").cost_peak  # fmt: skip


MIXED = """
node_types:
  - {name: g4dn, vcpus: 8, memory: 32Gi, gpus: 1, gpu_model: T4, price_per_hour: 0.75}
  - {name: g5, vcpus: 8, memory: 32Gi, gpus: 1, gpu_model: A10G, price_per_hour: 1.2}
  - {name: a100-mig, vcpus: 32, memory: 256Gi, accelerators: {nvidia.com/mig-1g.10gb: 7}, accelerator: A100 MIG,
     price_per_hour: 4.1}
  - {name: inf1, vcpus: 4, memory: 8Gi, accelerators: {aws.amazon.com/neuron: 1}, accelerator: Inferentia,
     price_per_hour: 0.22}
services:
  - name: m
    kind: model
    peak_rps: 30
    latency_budget_ms: 500
    model: MODEL
"""


def test_a_gpu_model_without_node_types_is_refused_where_gpus_differ() -> None:
    model = "{resources: {cpu: 1, memory: 4Gi, gpu: 1}, capacity: {rps: 2}}"
    with pytest.raises(PlanError) as info:
        planned(MIXED.replace("MODEL", model))
    message = str(info.value)
    assert "services[0] (m).model.node_types: missing: node types with nvidia.com/gpu carry A10G and T4" in message
    assert "name the ones this capacity was measured on" in message
    pinned = planned(MIXED.replace("MODEL", model.replace(", capacity", ", node_types: [g4dn], capacity", 1)))
    assert {n.shape.name for n in pinned.option("split-packed").nodes_peak} == {"g4dn"}
    # a resource that one kind of node offers needs no node_types; a node type without it is refused
    neuron = "{resources: {cpu: 1, memory: 2Gi, accelerators: {aws.amazon.com/neuron: 1}}, capacity: {rps: 1}}"
    assert {n.shape.name for n in planned(MIXED.replace("MODEL", neuron)).option("split-packed").nodes_peak} == {"inf1"}
    with pytest.raises(PlanError, match=r"model.node_types: g5 offers no aws.amazon.com/neuron"):
        planned(MIXED.replace("MODEL", neuron.replace(", capacity", ", node_types: [g5], capacity", 1)))


def test_mig_profiles_pack_as_many_pods_as_slices() -> None:
    mig = "{resources: {cpu: 2, memory: 16Gi, accelerators: {nvidia.com/mig-1g.10gb: 1}}, capacity: {rps: 2}}"
    split = planned(MIXED.replace("MODEL", mig)).option("split-packed")
    nodes = expand(split.nodes_peak)
    assert {n.shape.name for n in nodes} == {"a100-mig"}
    model = split.deployments[0]
    assert model.peak == 20  # 30 / (2 x 0.75)
    assert [sum(n.pods.values()) for n in nodes] == [7, 7, 6]  # seven slices a node, the last one part-filled


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("accelerators: {gpu: 1}", "'gpu' is not an extended resource name like 'nvidia.com/gpu'"),
        ("accelerators: {nvidia.com/gpu: -1}", "is a whole number of devices, 0 or more, got -1"),
        ("gpu: 1, accelerators: {nvidia.com/gpu: 1}", "give GPUs as `gpu: N` or as `accelerators: {nvidia.com/gpu"),
        ("accelerators: {kubernetes.io/x: 1}", "'kubernetes.io/x' is not an extended resource name"),
    ],
)
def test_bad_accelerators_are_named(edit: str, expected: str) -> None:
    text = MIXED.replace("MODEL", "{resources: {cpu: 1, memory: 2Gi, EDIT}, capacity: {rps: 1}}").replace("EDIT", edit)
    with pytest.raises(PlanError) as info:
        planned(text)
    assert "services[0] (m).model.resources" in str(info.value)
    assert expected in str(info.value)


def test_variants_are_checked() -> None:
    base = "{variants: [{name: a, node_types: [g4dn], resources: {cpu: 1, memory: 2Gi, gpu: 1}, capacity: {rps: 1}}]"
    ok = planned(MIXED.replace("MODEL", base + "}"))
    assert ok.families == ["a"]
    assert [o.name for o in ok.options] == ["cpu-only", "monolith-per-gpu-node", "split-packed", "shared-model-service"]
    for extra, expected in [
        (", resources: {cpu: 1, memory: 1Gi}", "model.resources: give it inside each of `variants`"),
        (", on_cpu: {resources: {cpu: 1, memory: 1Gi, gpu: 1}, capacity: {rps: 1}}", "model.on_cpu.resources: the CPU"),
    ]:
        with pytest.raises(PlanError) as info:
            planned(MIXED.replace("MODEL", base + extra + "}"))
        assert expected in str(info.value)
    empty = MIXED.replace("MODEL", "{variants: []}")
    with pytest.raises(PlanError, match=r"model.variants: empty: give one variant per accelerator"):
        planned(empty)
    twice = base.replace("}]", "}, {name: a, node_types: [g5], resources: {cpu: 1, memory: 2Gi, gpu: 1}, "
                         "capacity: {rps: 1}}]")  # fmt: skip
    with pytest.raises(PlanError, match=r"model.variants\[1\]: variant 'a' is listed twice"):
        planned(MIXED.replace("MODEL", twice + "}"))
    with pytest.raises(PlanError, match=r"model.variants\[0\].name: 'a b': a short label"):
        planned(MIXED.replace("MODEL", base.replace("name: a,", "name: a b,") + "}"))


def test_the_picture_draws_each_cost_curve_and_point(writeup: Planned) -> None:
    """One line per available option against traffic; per accelerated variant its curve, the alternative's level,
    and the measured and break-even throughputs, labelled with the numbers the table gives."""
    assert isinstance(writeup.sensitivity, Sensitivity)
    root = ElementTree.fromstring(render_svg(writeup))
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text or "" for t in root.iter(f"{ns}text")]
    lines = list(root.iter(f"{ns}polyline"))
    available = [o for o in writeup.options if not o.unavailable]
    assert len(lines) == len(available) + 2 * len(writeup.sensitivity.break_even)
    for b in writeup.sensitivity.break_even:
        assert f"measured {b.measured:.3g}" in texts
        assert b.at is not None
        assert f"break-even {b.at:.3g}" in texts
    assert [t for t in texts if t in {o.name for o in available}]  # the legend names them
