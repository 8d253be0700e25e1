"""The options a plan compares, each sized for peak and for average traffic, packed and priced.

- ``cpu-only``: the deployment before a move to GPUs: every half on CPU nodes (GPU models in their ``on_cpu``
  variant); CPU nodes only.
- ``monolith-per-gpu-node``: the naive move: each GPU service one monolith pod (logic and model together, serving
  what its slower half serves) alone on a GPU node; the other services as in ``cpu-only``, kept off GPU nodes.
- ``split-packed``: logic and model as separate Deployments, each with its own replicas; GPU model pods on GPU
  nodes, logic pods, CPU models and CPU services first onto the GPU nodes' spare CPUs, then onto CPU nodes.
- ``shared-model-service``: one model service whose every pod loads every model (requests summed, GPUs the
  largest); replicas for the busiest model; logic and CPU services packed as in ``split-packed``.

Replicas per half: ``max(min_replicas, ceil(rps / (capacity x (1 - headroom))))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ._capacity import Measured, resolve_capacity
from ._pack import Node, NoFit, PodSpec, Shape, cheapest_packing, check_fits, shape_of
from ._schema import Half, Plan, PlanError, Service, cpu_millis, format_cpu, format_memory, memory_bytes

__all__ = [
    "OPTIONS",
    "Option",
    "Planned",
    "Resolved",
    "Sized",
    "min_replicas_for",
    "plan_all",
    "replicas_for",
    "resolve",
]

OPTIONS = {
    "cpu-only": "before: every half on CPU nodes, GPU models in their CPU variant",
    "monolith-per-gpu-node": "naive move: each GPU service's monolith alone on a GPU node",
    "split-packed": "logic and model apart; CPU pods packed onto GPU nodes' spare CPUs first",
    "shared-model-service": "one model service holding every model; logic pods packed",
}


@dataclass(frozen=True)
class Resolved:
    """A half with integer requests and its capacity."""

    cpu: int
    memory: int
    gpu: int
    capacity: Measured
    node_types: frozenset[str] | None
    on_cpu: Resolved | None = None


@dataclass(frozen=True)
class ResolvedService:
    service: Service
    halves: dict[str, Resolved]

    @property
    def name(self) -> str:
        return self.service.name


def _half(half: Half, where: str, budget: float, base: Path, is_model: bool) -> Resolved:
    r = half.resources
    per = half.inferences_per_request if is_model else 1.0
    on_cpu = None
    if half.on_cpu is not None:
        c = half.on_cpu.resources
        on_cpu = Resolved(
            cpu_millis(c.cpu),
            memory_bytes(c.memory),
            0,
            resolve_capacity(half.on_cpu.capacity, f"{where}.on_cpu", budget, base, per),
            None,
        )
    return Resolved(
        cpu_millis(r.cpu),
        memory_bytes(r.memory),
        r.gpu,
        resolve_capacity(half.capacity, where, budget, base, per),
        frozenset(half.node_types) if half.node_types is not None else None,
        on_cpu,
    )


def resolve(plan: Plan, base: Path, source: str) -> list[ResolvedService]:
    out = []
    for i, svc in enumerate(plan.services):
        halves = {}
        for key in ("logic", "model", "pod"):
            half = getattr(svc, key)
            if half is not None:
                try:
                    halves[key] = _half(
                        half, f"services[{i}] ({svc.name}).{key}", svc.latency_budget_ms, base, key == "model"
                    )
                except PlanError as exc:
                    raise PlanError(f"{source}: {exc}") from exc
        out.append(ResolvedService(svc, halves))
    return out


def replicas_for(rps: float, capacity: float, headroom: float, min_replicas: int) -> int:
    if rps <= 0:
        return min_replicas
    return max(min_replicas, math.ceil(rps / (capacity * (1 - headroom)) - 1e-9))


@dataclass
class Sized:
    """One Deployment of an option: its pod, replicas at peak and average, and what one pod serves."""

    pod: PodSpec
    capacity_rps: float
    peak: int
    average: int
    rps_peak: float
    rps_average: float

    @property
    def headroom(self) -> float | None:
        """Capacity left at peak, as a share of what the replicas serve (None without traffic or replicas)."""
        total = self.peak * self.capacity_rps
        return None if total <= 0 or self.rps_peak <= 0 else 1 - self.rps_peak / total


@dataclass
class Option:
    name: str
    title: str
    deployments: list[Sized] = field(default_factory=list)
    nodes_peak: list[Node] = field(default_factory=list)
    nodes_average: list[Node] = field(default_factory=list)
    unavailable: str = ""

    @property
    def cost_peak(self) -> float:
        return sum(n.shape.price for n in self.nodes_peak)

    @property
    def cost_average(self) -> float:
        return sum(n.shape.price for n in self.nodes_average)


@dataclass
class Planned:
    plan: Plan
    services: list[ResolvedService]
    shapes: list[Shape]
    options: list[Option]

    @property
    def peak_rps(self) -> float:
        return sum(s.service.peak_rps for s in self.services)

    @property
    def average_rps(self) -> float:
        return sum(_average(s.service) for s in self.services)

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)


def _average(svc: Service) -> float:
    return svc.peak_rps if svc.average_rps is None else svc.average_rps


def min_replicas_for(plan: Plan, svc: Service) -> int:
    """The service's replicas per half at least: its own ``min_replicas``, else the cluster's."""
    return plan.cluster.min_replicas if svc.min_replicas is None else svc.min_replicas


class _Builder:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.headroom = plan.cluster.headroom

    def sized(self, svc: Service, pod: PodSpec, capacity: float) -> Sized:
        floor = min_replicas_for(self.plan, svc)
        peak, avg = svc.peak_rps, _average(svc)
        return Sized(
            pod,
            capacity,
            replicas_for(peak, capacity, self.headroom, floor),
            replicas_for(avg, capacity, self.headroom, floor),
            peak,
            avg,
        )

    def pod(self, svc: Service, half: str, r: Resolved, *, gpu_ok: bool, exclusive: bool = False) -> PodSpec:
        return PodSpec(svc.name, half, r.cpu, r.memory, r.gpu, r.node_types, gpu_ok, exclusive)

    def monolith(self, s: ResolvedService) -> Sized:
        """A GPU service as one kind of pod, alone on its node: logic and model together (or the model alone)."""
        svc, h = s.service, s.halves
        model = h["model"]
        parts = [model] + ([h["logic"]] if "logic" in h else [])
        allowed = [p.node_types for p in parts if p.node_types is not None]
        pod = PodSpec(
            svc.name,
            "monolith" if "logic" in h else "model",
            sum(p.cpu for p in parts),
            sum(p.memory for p in parts),
            model.gpu,
            frozenset.intersection(*allowed) if allowed else None,
            False,
            bool(model.gpu),
        )
        return self.sized(svc, pod, min(p.capacity.rps for p in parts))

    def split(
        self, s: ResolvedService, *, models: bool = True, gpu_ok: bool = True, on_cpu: bool = False
    ) -> list[Sized]:
        svc, out = s.service, []
        for key, r in s.halves.items():
            if key == "model" and not models:
                continue
            if on_cpu and r.gpu:
                if r.on_cpu is None:
                    raise _Unavailable(f"{svc.name}'s model needs a GPU and has no model.on_cpu")
                r = r.on_cpu
            out.append(self.sized(svc, self.pod(svc, key, r, gpu_ok=gpu_ok), r.capacity.rps))
        return out

    def shared(self, services: list[ResolvedService]) -> Sized:
        with_models = [s for s in services if "model" in s.halves]
        models = [s.halves["model"] for s in with_models]
        allowed = [m.node_types for m in models if m.node_types is not None]
        pod = PodSpec(
            "shared",
            "model",
            sum(m.cpu for m in models),
            sum(m.memory for m in models),
            max(m.gpu for m in models),
            frozenset.intersection(*allowed) if allowed else None,
            True,
        )
        each = [self.sized(s.service, pod, s.halves["model"].capacity.rps) for s in with_models]
        busiest = max(each, key=lambda d: (d.peak, d.average))
        return Sized(
            pod,
            busiest.capacity_rps,
            max(d.peak for d in each),
            max(d.average for d in each),
            busiest.rps_peak,
            busiest.rps_average,
        )


class _Unavailable(Exception):
    pass


def _on_gpu(s: ResolvedService) -> bool:
    return "model" in s.halves and s.halves["model"].gpu > 0


def _expand(deployments: list[Sized], at: str) -> list[PodSpec]:
    return [d.pod for d in deployments for _ in range(d.peak if at == "peak" else d.average)]


def _no_fit(exc: NoFit) -> str:
    p = exc.pod
    biggest = max(exc.shapes, key=lambda s: (s.gpu, s.cpu, s.memory))
    want = f"cpu {format_cpu(p.cpu)}, memory {format_memory(p.memory)}" + (f", nvidia.com/gpu {p.gpu}" if p.gpu else "")
    limit = f" (only {sorted(p.node_types)} allowed)" if p.node_types is not None else ""
    return (
        f"{p.label}: a pod requests {want}, which no node type holds{limit}; the largest, {biggest.name}, leaves pods "
        f"cpu {format_cpu(biggest.cpu)}, memory {format_memory(biggest.memory)}, nvidia.com/gpu {biggest.gpu} "
        "after the reservation and the DaemonSets: lower the pod's requests or add a node type that holds it"
    )


def plan_all(plan: Plan, base: Path, source: str = "plan") -> Planned:
    """Resolve capacities and build every option. :class:`PlanError` for bad input and for a split pod (the pods
    the plan deploys) that fits no node; an option whose own pods fit nowhere is marked unavailable."""
    services = resolve(plan, base, source)
    shapes = [shape_of(n, plan.cluster) for n in plan.node_types]
    b = _Builder(plan)
    options = []
    for name, title in OPTIONS.items():
        option = Option(name, title)
        try:
            if name == "cpu-only":
                option.deployments = [d for s in services for d in b.split(s, gpu_ok=False, on_cpu=True)]
            elif name == "monolith-per-gpu-node":
                option.deployments = [
                    d for s in services for d in ([b.monolith(s)] if _on_gpu(s) else b.split(s, gpu_ok=False))
                ]
            elif name == "split-packed":
                option.deployments = [d for s in services for d in b.split(s)]
            else:
                if not any("model" in s.halves for s in services):
                    raise _Unavailable("no service has a model half")
                option.deployments = [d for s in services for d in b.split(s, models=False)]
                option.deployments.append(b.shared(services))
            usable = [s for s in shapes if not s.gpu] if name == "cpu-only" else shapes
            if not usable:
                raise _Unavailable("no CPU node type on offer")
            check_fits([d.pod for d in option.deployments], usable)  # with no replicas too
            option.nodes_peak = cheapest_packing(_expand(option.deployments, "peak"), usable)
            option.nodes_average = cheapest_packing(_expand(option.deployments, "average"), usable)
        except _Unavailable as exc:
            option.unavailable = str(exc)
        except NoFit as exc:
            if name == "split-packed":
                i = next(i for i, s in enumerate(services) if s.name == exc.pod.service)
                raise PlanError(f"{source}: services[{i}] ({exc.pod.service}): {_no_fit(exc)}") from exc
            option.unavailable = _no_fit(exc)
        options.append(option)
    return Planned(plan, services, shapes, options)
