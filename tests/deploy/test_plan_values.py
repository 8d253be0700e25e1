"""``logicd plan --write-values``: the values render with helm/ml-service (its schema checks them on the way) and
place the pods as the plan priced them. Each example plan's values are rendered with `helm template`, the
rendered Deployments (and the placement patches of the services the chart does not deploy) are read back into
pods (requests, replicas, node selector, required node affinity, tolerations), and then:

- the plan's own packing is checked against them: every pod on every node is one the manifests allow there (its
  node type, labels and taints) and every Deployment's replicas are placed;
- the plan's packer places the rendered pods again, on the node types they allow: it needs no more than the plan
  priced.

Without the tolerations the plan wrote, the same check fails: it is not one that cannot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from logicd.plan import Planned, example_plan, parse_plan, plan_all, values_for
from logicd.plan._pack import PodSpec, Shape, cheapest_packing, extended
from logicd.plan._quantities import cpu_millis, memory_bytes
from logicd.plan._values import GPU_LABEL, INSTANCE_TYPE, patch_for, taints, values_option, write_values
from tests import _helm
from tests._helm import ROOT, Doc, Renderer

helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer

Pod = dict[str, Any]
"""A rendered pod: service, half, requests, replicas, the node types it may use, its tolerations."""


@pytest.fixture(scope="module", params=["default", "accelerators"])
def planned(request: pytest.FixtureRequest) -> Planned:
    return plan_all(parse_plan(example_plan(request.param), request.param), ROOT, sensitive=False)


def _labels(shape: Shape) -> dict[str, str]:
    out = {INSTANCE_TYPE: shape.name}
    if shape.room("nvidia.com/gpu"):
        out[GPU_LABEL] = "true"  # NVIDIA's GPU feature discovery
    return out


def _allowed(spec: Doc, shapes: list[Shape]) -> set[str]:
    """The node types a pod spec may be scheduled on: its nodeSelector and required node affinity."""
    out = set()
    for shape in shapes:
        labels = _labels(shape)
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            continue
        required = (
            (spec.get("affinity") or {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        if required is not None:
            terms = required["nodeSelectorTerms"]
            ok = any(all(e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in t["matchExpressions"])
                     for t in terms)  # fmt: skip
            if not ok:
                continue
        out.add(shape.name)
    return out


def _tolerates(spec: Doc, shape: Shape) -> bool:
    tolerations = spec.get("tolerations") or []

    def tolerated(taint: dict[str, str]) -> bool:
        return any(t.get("key") == taint["key"] and t.get("operator") == "Exists"
                   and t.get("effect") in (None, taint["effect"]) for t in tolerations)  # fmt: skip

    return all(tolerated(taint) for taint in taints(shape.accelerators))


def _pod(service: str, half: str, replicas: int, spec: Doc) -> Pod:
    (c,) = spec["containers"]
    requests, limits = c["resources"]["requests"], c["resources"].get("limits", {})
    acc = {k: int(v) for k, v in limits.items() if "/" in k}
    return {"service": service, "half": half, "replicas": replicas, "spec": spec, "cpu": cpu_millis(requests["cpu"]),
            "memory": memory_bytes(requests["memory"]), "acc": extended(acc)}  # fmt: skip


def rendered_pods(planned: Planned, renderer: Renderer, out: Path, strip_tolerations: bool = False) -> list[Pod]:
    """The pods the values and patches deploy, read back from `helm template` and the patches."""
    option = values_option(planned)
    write_values(planned, out, "plan.yaml")
    pods = []
    for s in planned.services:
        if s.service.kind != "pair":
            patch = yaml.safe_load((out / f"{s.name}.placement.yaml").read_text())
            assert patch == patch_for(planned, s.name, option)
            spec = patch["spec"]["template"]["spec"]
            if strip_tolerations:
                spec.pop("tolerations", None)
            half = "pod" if s.service.kind == "cpu" else "model"
            pods.append(_pod(s.name, half, patch["spec"]["replicas"], spec))
            continue
        values = out / f"{s.name}.yaml"
        if strip_tolerations:
            v = yaml.safe_load(values.read_text())
            for key in ("logic", "model"):
                v[key].pop("tolerations", None)
            v["gpu"]["tolerations"] = []
            values.write_text(yaml.safe_dump(v))
        docs = renderer.render("-f", str(values), "--set", "autoscaling.enabled=false")
        for d in docs:
            if d["kind"] == "Deployment":
                half = d["metadata"]["labels"]["app.kubernetes.io/component"]
                pods.append(_pod(s.name, half, d["spec"]["replicas"], d["spec"]["template"]["spec"]))
    return pods


def misplaced(planned: Planned, pods: list[Pod]) -> list[str]:
    """What in the plan's packing the rendered pods do not allow (empty: the manifests place it as priced)."""
    option = values_option(planned)
    by_half = {(p["service"], p["half"]): p for p in pods}
    problems, placed = [], Counter[tuple[str, str]]()
    for node in option.nodes_peak:
        for pod, n in node.pods.items():
            r = by_half.get((pod.service, pod.half))
            if r is None:
                problems.append(f"{pod.label}: not rendered")
                continue
            placed[(pod.service, pod.half)] += n * node.count
            if (r["cpu"], r["memory"], r["acc"]) != (pod.cpu, pod.memory, pod.accelerators):
                problems.append(f"{pod.label}: requests {r['cpu'], r['memory'], r['acc']} are not the plan's")
            if node.shape.name not in _allowed(r["spec"], planned.shapes):
                problems.append(f"{pod.label}: may not run on {node.shape.name}")
            if not _tolerates(r["spec"], node.shape):
                problems.append(f"{pod.label}: does not tolerate {node.shape.name}'s taints")
    for key, r in by_half.items():
        if placed[key] != r["replicas"]:
            problems.append(f"{key}: {r['replicas']} replicas rendered, {placed[key]} placed")
    return problems


def test_the_rendered_pods_allow_the_priced_packing(planned: Planned, renderer: Renderer, tmp_path: Path) -> None:
    pods = rendered_pods(planned, renderer, tmp_path)
    assert {(p["service"], p["half"]) for p in pods} == {
        (d.pod.service, d.pod.half) for d in values_option(planned).deployments
    }
    assert misplaced(planned, pods) == []


def test_the_packer_places_the_rendered_pods_for_what_was_priced(
    planned: Planned, renderer: Renderer, tmp_path: Path
) -> None:
    option = values_option(planned)
    specs = []
    for p in rendered_pods(planned, renderer, tmp_path):
        allowed = frozenset(_allowed(p["spec"], planned.shapes))
        tolerates = all(_tolerates(p["spec"], s) for s in planned.shapes if s.name in allowed and s.accelerators)
        specs.append((PodSpec(p["service"], p["half"], p["cpu"], p["memory"], p["acc"], allowed, tolerates),
                      p["replicas"]))  # fmt: skip
    again = cheapest_packing(specs, planned.shapes)
    assert sum(n.shape.price * n.count for n in again) <= option.cost_peak + 1e-9


def test_without_the_tolerations_the_packing_is_not_allowed(
    planned: Planned, renderer: Renderer, tmp_path: Path
) -> None:
    option = values_option(planned)
    on_accelerators = {p.service for n in option.nodes_peak if n.shape.accelerators for p in n.pods if not p.gpu}
    assert on_accelerators  # CPU pods share the accelerator nodes in both examples
    problems = misplaced(planned, rendered_pods(planned, renderer, tmp_path, strip_tolerations=True))
    assert {p.split("/")[0] for p in problems if "does not tolerate" in p} >= on_accelerators


def test_values_follow_capacity_and_budget() -> None:
    example = plan_all(parse_plan(example_plan()), ROOT, sensitive=False)
    v = values_for(example, "doc-classifier")
    assert v["gpu"]["enabled"] is True
    assert (v["gpu"]["resourceName"], v["gpu"]["count"]) == ("nvidia.com/gpu", 1)
    assert v["logic"]["autoscaling"]["keda"]["requestRate"]["targetPerReplica"] == 15.0  # 20 req/s x (1 - 0.25)
    keda = v["model"]["autoscaling"]["keda"]
    assert keda["queueTime"]["targetMicroseconds"] == 130_000  # half of 300 ms budget - 40 ms p50
    assert keda["pendingRequests"]["targetPerReplica"] == 156.0  # 800 calls/s x 0.75 x 0.26 s
    assert v["model"]["replicas"] == v["model"]["autoscaling"]["maxReplicas"] == 6
    cpu_pair = values_for(example, "pii-detect")  # packed onto GPU nodes: it tolerates their taint
    assert cpu_pair["gpu"]["enabled"] is False
    assert cpu_pair["model"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_an_inferentia_model_asks_for_neuron_and_drops_nvidias_label(tmp_path: Path, renderer: Renderer) -> None:
    planned = plan_all(parse_plan(example_plan("accelerators")), ROOT, sensitive=False)
    option = values_option(planned)
    assert option.name == "split-packed@inferentia"
    v = values_for(planned, "doc-classifier", option)
    assert (v["gpu"]["resourceName"], v["gpu"]["nodeSelector"]) == ("aws.amazon.com/neuron", {GPU_LABEL: None})
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(v))
    docs = renderer.render("-f", str(path), "--set", "autoscaling.enabled=false")
    model = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-model"))
    spec = model["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"]["limits"]["aws.amazon.com/neuron"] == 1
    assert "nodeSelector" not in spec  # NVIDIA's label removed, nothing else asked
    assert _allowed(spec, planned.shapes) == {"inf1.xlarge"}
    t4 = values_for(planned, "doc-classifier", planned.option("split-packed@t4-trt"))
    assert t4["gpu"]["resourceName"] == "nvidia.com/gpu"
    assert "nodeSelector" not in t4["gpu"]  # the chart's default (NVIDIA's label) stays
