"""``--write-values DIR``: per logic+model pair of the ``split-packed`` option, a values file for helm/ml-service
that deploys what the plan counted: requests, replicas, and KEDA targets derived from capacity and budget.

- logic: ``requestRate.targetPerReplica`` = capacity per pod x (1 - headroom): the rate at which the plan adds a
  replica; CPU target = (1 - headroom) x 100 %.
- model: the room the latency budget leaves above the measured p50 (half the budget when no p50 is known) is the
  queueing the model may add. ``queueTime.targetMicroseconds`` is half that room (the trigger averages, the
  budget is a p99); ``pendingRequests.targetPerReplica`` is what a pod at its target rate accumulates over that
  room (Little's law: model calls/s x seconds); GPU (or, for a CPU model, CPU) target = (1 - headroom) x 100 %.
- replicas: the plan's replicas at peak (used when autoscaling is off) and ``maxReplicas``; ``minReplicas`` is
  the plan's minimum (at least 1, the chart's floor).
- A CPU pair that the plan packs onto GPU nodes gets the GPU taint's toleration on both halves.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from ._options import Planned, Sized, min_replicas_for
from ._schema import format_cpu, format_memory

__all__ = ["GPU_TOLERATION", "values_for", "write_values"]

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
"""The chart's default GPU taint toleration (gpu.tolerations in helm/ml-service/values.yaml)."""


def _resources(d: Sized) -> dict[str, Any]:
    memory = format_memory(d.pod.memory)
    return {"requests": {"cpu": format_cpu(d.pod.cpu), "memory": memory}, "limits": {"memory": memory}}


def _target(headroom: float, top: int) -> int:
    return max(1, min(top, round(100 * (1 - headroom))))


def values_for(planned: Planned, service: str) -> dict[str, Any]:
    """The values of one pair service (its split-packed deployments)."""
    option = planned.option("split-packed")
    h = planned.plan.cluster.headroom
    resolved = next(s for s in planned.services if s.name == service)
    svc = resolved.service
    logic = next(d for d in option.deployments if d.pod.service == service and d.pod.half == "logic")
    model = next(d for d in option.deployments if d.pod.service == service and d.pod.half == "model")
    floor = min_replicas_for(planned.plan, svc)
    measured = resolved.halves["model"].capacity
    per_request = svc.model.inferences_per_request if svc.model is not None else 1.0
    p50 = measured.p50_ms if measured.p50_ms is not None else svc.latency_budget_ms / 2
    room_ms = max(1.0, svc.latency_budget_ms - p50)
    calls_per_s = model.capacity_rps * per_request * (1 - h)
    gpu = model.pod.gpu
    on_gpu_nodes = any(
        n.shape.gpu and any(p.service == service and not p.gpu for p in n.pods) for n in option.nodes_peak
    )

    def autoscaling(d: Sized) -> dict[str, Any]:
        low = max(1, floor)
        return {"minReplicas": low, "maxReplicas": max(low, d.peak)}

    values: dict[str, Any] = {
        "gpu": {"enabled": bool(gpu), "count": max(1, gpu)},
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
                    "gpuUtilization": {"enabled": bool(gpu), "targetUtilization": _target(h, 100)},
                    "cpu": {"enabled": not gpu, "targetUtilization": _target(h, 1000)},
                },
            },
        },
    }
    if on_gpu_nodes and not gpu:
        values["logic"]["tolerations"] = [dict(GPU_TOLERATION)]
        values["model"]["tolerations"] = [dict(GPU_TOLERATION)]
    return values


def write_values(planned: Planned, out_dir: Path, plan_name: str) -> tuple[list[Path], list[str]]:
    """Write ``out_dir/<service>.yaml`` per pair service; returns the files and the services skipped (with why)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    h = planned.plan.cluster.headroom
    for s in planned.services:
        if s.service.kind != "pair":
            skipped.append(f"{s.name}: kind {s.service.kind} (helm/ml-service deploys a logic+model pair)")
            continue
        head = [
            f"# helm/ml-service values for {s.name}, written by `logicd plan {plan_name} --write-values`",
            f"# (option split-packed). Sized for peak {s.service.peak_rps:g} req/s with {100 * h:.0f}% headroom, "
            f"latency budget {s.service.latency_budget_ms:g} ms.",
            *(
                f"# {k} capacity: {half.capacity.rps:,.1f} req/s per pod ({half.capacity.source})"
                for k, half in s.halves.items()
            ),
            f"# helm upgrade --install {s.name} helm/ml-service -f {s.name}.yaml -f <images and service.yaml>",
        ]
        path = out_dir / f"{s.name}.yaml"
        body = yaml.safe_dump(values_for(planned, s.name), sort_keys=False, default_flow_style=False)
        path.write_text("\n".join(head) + "\n" + body, encoding="utf-8")
        written.append(path)
    return written, skipped
