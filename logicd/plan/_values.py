"""``--write-values DIR``: what deploys the packing the plan priced, from one ``split-packed`` option (the cheapest,
or the one ``--values-option`` names).

- Per logic+model pair, ``DIR/<service>.yaml``, values for helm/ml-service: requests, replicas, KEDA targets
  derived from capacity and budget, and placement.
- Per ``cpu`` or ``model`` service (the chart deploys pairs), ``DIR/<service>.placement.yaml``: a strategic-merge
  patch of its Deployment (``kubectl patch`` or kustomize) with the same placement, replicas and requests.

Placement: every half gets a required node affinity on the node types (``node.kubernetes.io/instance-type``) the
plan put its pods on, and a toleration of each accelerator node's taint (the resource's name, ``NoSchedule``)
where it put them on accelerator nodes: CPU pairs and ``cpu`` services on GPU nodes included. The chart's own
GPU-node preference for logic pods is turned off (the affinity replaces it); an accelerated model that is not on
NVIDIA GPUs gets ``gpu.resourceName`` and its node selector without NVIDIA's label.

KEDA targets:
- logic: ``requestRate.targetPerReplica`` = capacity per pod x (1 - headroom): the rate at which the plan adds a
  replica; CPU target = (1 - headroom) x 100 %.
- model: the room the latency budget leaves above the measured p50 (half the budget when no p50 is known) is the
  queueing the model may add. ``queueTime.targetMicroseconds`` is half that room (the trigger averages, the
  budget is a p99); ``pendingRequests.targetPerReplica`` is what a pod at its target rate accumulates over that
  room (Little's law: model calls/s x seconds); GPU (or, for a CPU model, CPU) target = (1 - headroom) x 100 %.
- replicas: the plan's replicas at peak (used when autoscaling is off) and ``maxReplicas``; ``minReplicas`` is
  the plan's minimum (at least 1, the chart's floor).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from ._options import Option, Planned, Sized, min_replicas_for
from ._quantities import format_cpu, format_memory
from ._schema import GPU, PlanError

__all__ = ["GPU_TOLERATION", "INSTANCE_TYPE", "placement", "taints", "values_for", "values_option", "write_values"]

GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
"""The chart's default GPU taint toleration (gpu.tolerations in helm/ml-service/values.yaml)."""

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
"""The well-known label every node carries with its type (the node type's name in the plan)."""

GPU_LABEL = "nvidia.com/gpu.present"
"""The label of NVIDIA GPU nodes that the chart's gpu.nodeSelector asks for by default."""


def taints(accelerators: Any) -> list[dict[str, str]]:
    """The taints the plan assumes on a node with these extended resources: one per resource, ``NoSchedule``."""
    return [{"key": name, "effect": "NoSchedule"} for name, _ in accelerators]


def values_option(planned: Planned, name: str | None = None) -> Option:
    """The option whose packing the values deploy: ``name`` (a split-packed option), else the cheapest
    split-packed at peak."""
    split = [o for o in planned.options if o.kind == "split-packed" and not o.unavailable]
    if name is not None:
        found = next((o for o in split if o.name == name), None)
        if found is None:
            raise PlanError(f"--values-option: {name!r} is not an available split-packed option of this plan; "
                            f"it has {', '.join(o.name for o in split) or 'none'}")  # fmt: skip
        return found
    if not split:
        raise PlanError("--write-values: no split-packed option is available to deploy")
    return planned.option(planned.cheapest({o.name: o.cost_peak for o in split}) or split[0].name)


def placement(option: Option, service: str, half: str) -> dict[str, Any]:
    """``affinity`` and ``tolerations`` that keep a half on the node types the plan put it on."""
    types: set[str] = set()
    tolerated: dict[str, dict[str, str]] = {}
    for node in option.nodes_peak:
        if any(p.service == service and p.half == half for p in node.pods):
            types.add(node.shape.name)
            for taint in taints(node.shape.accelerators):
                tolerated[taint["key"]] = {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}
    if not types:
        return {}
    term = {"matchExpressions": [{"key": INSTANCE_TYPE, "operator": "In", "values": sorted(types)}]}
    out: dict[str, Any] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}  # fmt: skip
    if tolerated:
        out["tolerations"] = [tolerated[k] for k in sorted(tolerated)]
    return out


def _resources(d: Sized) -> dict[str, Any]:
    memory = format_memory(d.pod.memory)
    return {"requests": {"cpu": format_cpu(d.pod.cpu), "memory": memory}, "limits": {"memory": memory}}


def _target(headroom: float, top: int) -> int:
    return max(1, min(top, round(100 * (1 - headroom))))


def _deployment(option: Option, service: str, half: str) -> Sized:
    return next(d for d in option.deployments if d.pod.service == service and d.pod.half == half)


def values_for(planned: Planned, service: str, option: Option | None = None) -> dict[str, Any]:
    """The values of one pair service in ``option`` (default: :func:`values_option`)."""
    option = option or values_option(planned)
    h = planned.plan.cluster.headroom
    resolved = next(s for s in planned.services if s.name == service)
    svc = resolved.service
    logic, model = _deployment(option, service, "logic"), _deployment(option, service, "model")
    floor = min_replicas_for(planned.plan, svc)
    measured = resolved.model_for(option.family).capacity
    per_request = svc.model.inferences_per_request if svc.model is not None else 1.0
    p50 = measured.p50_ms if measured.p50_ms is not None else svc.latency_budget_ms / 2
    room_ms = max(1.0, svc.latency_budget_ms - p50)
    calls_per_s = model.capacity_rps * per_request * (1 - h)
    accelerators = dict(model.pod.accelerators)
    if len(accelerators) > 1:
        raise PlanError(f"{service}: helm/ml-service gives a model pod one kind of accelerator, this one asks for "
                        f"{', '.join(sorted(accelerators))}")  # fmt: skip
    resource, count = next(iter(accelerators.items()), (GPU, 0))

    def autoscaling(d: Sized) -> dict[str, Any]:
        low = max(1, floor)
        return {"minReplicas": low, "maxReplicas": max(low, d.peak)}

    gpu: dict[str, Any] = {"enabled": bool(count), "resourceName": resource, "count": max(1, count),
                           "logicPlacement": {"preferGpuNodes": False}}  # fmt: skip
    if count and resource != GPU:
        gpu["nodeSelector"] = {GPU_LABEL: None}  # not NVIDIA's: the required affinity alone places it
    values: dict[str, Any] = {
        "gpu": gpu,
        "logic": {
            "replicas": logic.peak,
            "resources": _resources(logic),
            "autoscaling": {
                **autoscaling(logic),
                "keda": {
                    "requestRate": {"enabled": True, "targetPerReplica": round(logic.capacity_rps * (1 - h), 2)},
                    "cpu": {"enabled": True, "targetUtilization": _target(h, 1000)},
                },
            },
            **placement(option, service, "logic"),
        },
        "model": {
            "replicas": model.peak,
            "resources": _resources(model),
            "autoscaling": {
                **autoscaling(model),
                "keda": {
                    "queueTime": {"enabled": True, "targetMicroseconds": max(1, math.floor(room_ms * 1000 / 2))},
                    "pendingRequests": {
                        "enabled": True,
                        "targetPerReplica": max(1.0, round(calls_per_s * room_ms / 1000, 1)),
                    },
                    "gpuUtilization": {"enabled": bool(count), "targetUtilization": _target(h, 100)},
                    "cpu": {"enabled": not count, "targetUtilization": _target(h, 1000)},
                },
            },
            **placement(option, service, "model"),
        },
    }
    workers = resolved.model_for(option.family).workers
    if workers is not None and option.family != "cpu":
        values["model"]["workers"] = workers  # the capacity's; the chart would derive the same from the CPU request
    if count:
        tolerations = values["model"].pop("tolerations", [])
        gpu["tolerations"] = tolerations  # the chart gives gpu.tolerations to the model pods
    return values


def patch_for(planned: Planned, service: str, option: Option) -> dict[str, Any]:
    """A strategic-merge patch of a ``cpu`` or ``model`` service's Deployment: replicas, requests, placement."""
    resolved = next(s for s in planned.services if s.name == service)
    half = "pod" if resolved.service.kind == "cpu" else "model"
    d = _deployment(option, service, half)
    resources = _resources(d)
    for name, count in d.pod.accelerators:
        resources["limits"][name] = count
    where = placement(option, service, half)
    spec: dict[str, Any] = {"containers": [{"name": service, "resources": resources}], **where}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": service},
            "spec": {"replicas": d.peak, "template": {"spec": spec}}}  # fmt: skip


def write_values(
    planned: Planned, out_dir: Path, plan_name: str, option_name: str | None = None
) -> tuple[list[Path], list[str]]:
    """Write ``out_dir/<service>.yaml`` per pair service and ``out_dir/<service>.placement.yaml`` per other
    service; returns the files and the notes on what was written instead of chart values."""
    option = values_option(planned, option_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    h = planned.plan.cluster.headroom
    for s in planned.services:
        head = [f"# written by `logicd plan {plan_name} --write-values` (option {option.name}): sized for peak "
                f"{s.service.peak_rps:g} req/s with {100 * h:.0f}% headroom, latency budget "
                f"{s.service.latency_budget_ms:g} ms; placed where the plan packed it."]  # fmt: skip
        head += [f"# {k} capacity: {half.capacity.rps:,.4g} req/s per pod ({half.capacity.source})"
                 for k, half in s.halves.items() if k != "model"]  # fmt: skip
        if "model" in s.halves:
            m = s.model_for(option.family)
            head.append(f"# model capacity: {m.capacity.rps:,.4g} req/s per pod ({m.capacity.source})")
        if s.service.kind == "pair":
            path = out_dir / f"{s.name}.yaml"
            head.append(
                f"# helm upgrade --install {s.name} helm/ml-service -f {s.name}.yaml -f <images and service.yaml>"
            )
            body = yaml.safe_dump(values_for(planned, s.name, option), sort_keys=False, default_flow_style=False)
        else:
            path = out_dir / f"{s.name}.placement.yaml"
            head.append(
                f"# kind {s.service.kind}: helm/ml-service deploys a logic+model pair; this patches the service's "
                f"own Deployment: kubectl patch deployment {s.name} --patch-file {path.name}"
            )
            body = yaml.safe_dump(patch_for(planned, s.name, option), sort_keys=False, default_flow_style=False)
            notes.append(f"{s.name}: kind {s.service.kind}, a Deployment patch (the chart deploys a logic+model pair)")
        path.write_text("\n".join(head) + "\n" + body, encoding="utf-8")
        written.append(path)
    return written, notes
