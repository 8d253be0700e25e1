"""The options a plan compares, each sized for peak and for average traffic, packed and priced.

- ``cpu-only``: the deployment before a move to accelerators: every half on CPU nodes (accelerated models in
  their ``on_cpu`` variant); CPU nodes only.
- ``monolith-per-gpu-node``: the naive move: each accelerated service one monolith pod (the model and as many
  logic workers as the node's spare CPUs hold, no more than keep the accelerator busy) alone on an accelerator
  node, of the type that costs least; the other services as in ``cpu-only``, kept off accelerator nodes.
- ``split-packed``: logic and model as separate Deployments, each with its own replicas; accelerated model pods
  on accelerator nodes, logic pods, CPU models and CPU services first onto those nodes' spare CPUs, then onto CPU
  nodes.
- ``shared-model-service``: one model service whose every pod loads every model (requests summed, accelerators
  the largest); replicas for the busiest model; logic and CPU services packed as in ``split-packed``.

Where a model gives ``variants`` (one per accelerator it was measured on), the last three are built once per
variant name, the family: ``split-packed@t4-trt``, ``split-packed@inferentia``; a service without a variant of
that name uses its first. With one family the names stay plain.

Replicas per half: ``max(min_replicas, ceil(rps / (capacity x (1 - headroom))))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ._capacity import Measured, resolve_capacity
from ._pack import Extended, Node, NoFit, PodSpec, Shape, cheapest_packing, check_fits, extended, shape_of
from ._quantities import cpu_millis, format_cpu, format_memory, memory_bytes
from ._schema import Half, Plan, PlanError, Resources, Service

__all__ = [
    "KINDS",
    "MAX_PODS",
    "PREFERENCE",
    "Option",
    "Planned",
    "Resolved",
    "ResolvedService",
    "Sized",
    "build_option",
    "min_replicas_for",
    "plan_options",
    "replicas_for",
    "resolve",
]

KINDS = {
    "cpu-only": "before: every half on CPU nodes, accelerated models in their CPU variant",
    "monolith-per-gpu-node": "naive move: each accelerated service's monolith alone on an accelerator node",
    "split-packed": "logic and model apart; CPU pods packed onto accelerator nodes' spare CPUs first",
    "shared-model-service": "one model service holding every model; logic pods packed",
}

PREFERENCE = {"split-packed": 0, "cpu-only": 1, "monolith-per-gpu-node": 2, "shared-model-service": 3}
"""Which option a tie in cost goes to: logic and model apart first, then the simpler deployments."""

MAX_PODS = 10**18
"""Replicas of one Deployment beyond which a plan is refused as a mistake (no cluster runs that many pods)."""


@dataclass(frozen=True)
class Resolved:
    """A half (or one variant of a model) with integer requests and its capacity."""

    cpu: int
    memory: int
    accelerators: Extended
    capacity: Measured
    node_types: frozenset[str] | None
    on_cpu: Resolved | None = None
    variant: str = ""
    workers: int | None = None
    """modelsvc's ``--workers`` for a model measured with ingest workers (its ``cpu`` counts them)."""

    @property
    def gpu(self) -> int:
        return sum(v for _, v in self.accelerators)


@dataclass(frozen=True)
class ResolvedService:
    service: Service
    halves: dict[str, Resolved]
    """logic / model / pod; the model as its first variant."""
    variants: dict[str, Resolved] = field(default_factory=dict)
    """The model's variants by name (one entry, its default name, for a model given without ``variants``)."""

    @property
    def name(self) -> str:
        return self.service.name

    @property
    def accelerated(self) -> bool:
        return any(v.gpu for v in self.variants.values())

    def model_for(self, family: str) -> Resolved:
        return self.variants.get(family) or self.halves["model"]


def _requests(r: Resources) -> tuple[int, int, Extended]:
    return cpu_millis(r.cpu), memory_bytes(r.memory), extended(r.extended())


def _default_name(plan: Plan, r: Resources, node_types: list[str] | None) -> str:
    """A model given without variants is the family of its accelerator's name (A10G), else its resource's."""
    wants = r.extended()
    if not wants:
        return "cpu"
    offering = [n for n in plan.node_types if (node_types is None or n.name in node_types)]
    labels = {n.label for n in offering if all(n.extended().get(k, 0) >= c for k, c in wants.items())}
    return labels.pop() if len(labels) == 1 else "+".join(sorted(wants))


def _with_ingest(cpu: int, workers: int | None) -> int:
    """A model pod's CPU request with its ingest workers counted: one CPU each and one for the engine, at least."""
    return cpu if not workers else max(cpu, (workers + 1) * 1000)


def _half(plan: Plan, half: Half, where: str, budget: float, base: Path, is_model: bool) -> list[Resolved]:
    per = half.inferences_per_request if is_model else 1.0
    on_cpu = None
    if half.on_cpu is not None:
        cpu, memory, acc = _requests(half.on_cpu.resources)
        measured = resolve_capacity(half.on_cpu.capacity, f"{where}.on_cpu", budget, base, per)
        on_cpu = Resolved(cpu, memory, acc, measured, None, None, "cpu")
    out = []
    if half.resources is not None:
        cpu, memory, acc = _requests(half.resources)
        allowed = frozenset(half.node_types) if half.node_types is not None else None
        name = _default_name(plan, half.resources, half.node_types) if is_model else ""
        measured = resolve_capacity(half.capacity, where, budget, base, per)
        workers = half.ingest_workers if is_model else None
        out.append(Resolved(_with_ingest(cpu, workers), memory, acc, measured, allowed, on_cpu, name, workers))
    for j, v in enumerate(half.variants or []):
        cpu, memory, acc = _requests(v.resources)
        allowed = frozenset(v.node_types) if v.node_types is not None else None
        measured = resolve_capacity(v.capacity, f"{where}.variants[{j}] ({v.name})", budget, base, per)
        workers = v.ingest_workers
        out.append(Resolved(_with_ingest(cpu, workers), memory, acc, measured, allowed, on_cpu, v.name, workers))
    return out


def resolve(plan: Plan, base: Path, source: str) -> list[ResolvedService]:
    out = []
    for i, svc in enumerate(plan.services):
        halves: dict[str, Resolved] = {}
        variants: dict[str, Resolved] = {}
        for key in ("logic", "model", "pod"):
            half = getattr(svc, key)
            if half is None:
                continue
            try:
                found = _half(plan, half, f"services[{i}] ({svc.name}).{key}", svc.latency_budget_ms, base,
                              key == "model")  # fmt: skip
            except PlanError as exc:
                raise PlanError(f"{source}: {exc}") from exc
            halves[key] = found[0]
            if key == "model":
                variants = {r.variant: r for r in found}
        out.append(ResolvedService(svc, halves, variants))
    return out


def replicas_for(rps: float, capacity: float, headroom: float, min_replicas: int) -> int:
    if rps <= 0:
        return min_replicas
    need = rps / (capacity * (1 - headroom))
    if not need <= MAX_PODS:
        raise OverflowError(f"{need:.3g}")
    return max(min_replicas, math.ceil(need - 1e-9))


@dataclass
class Sized:
    """One Deployment of an option: its pod, replicas at peak and average, and what one pod serves."""

    pod: PodSpec
    capacity_rps: float
    peak: int
    average: int
    rps_peak: float
    rps_average: float
    note: str = ""
    shares: dict[str, float] = field(default_factory=dict)
    """A shared model service's pods: each service's share of their cost (the replicas it alone would need,
    times its model's CPU request)."""

    @property
    def headroom(self) -> float | None:
        """Capacity left at peak, as a share of what the replicas serve (None without traffic or replicas)."""
        total = self.peak * self.capacity_rps
        return None if total <= 0 or self.rps_peak <= 0 else 1 - self.rps_peak / total


@dataclass
class Option:
    name: str
    title: str
    kind: str = ""
    family: str = ""
    deployments: list[Sized] = field(default_factory=list)
    nodes_peak: list[Node] = field(default_factory=list)
    nodes_average: list[Node] = field(default_factory=list)
    unavailable: str = ""

    @property
    def shared(self) -> dict[str, float]:
        """Each service's share of the shared model service's pods (empty but for shared-model-service)."""
        return next((d.shares for d in self.deployments if d.shares), {})

    @property
    def cost_peak(self) -> float:
        return sum(n.shape.price * n.count for n in self.nodes_peak)

    @property
    def cost_average(self) -> float:
        return sum(n.shape.price * n.count for n in self.nodes_average)


@dataclass
class Planned:
    plan: Plan
    services: list[ResolvedService]
    shapes: list[Shape]
    options: list[Option]
    families: list[str] = field(default_factory=list)
    sensitivity: object = None
    """The cost against traffic and against per-pod throughput (``_sensitivity.Sensitivity``), when asked for."""

    @property
    def peak_rps(self) -> float:
        return sum(s.service.peak_rps for s in self.services)

    @property
    def average_rps(self) -> float:
        return sum(average_of(s.service) for s in self.services)

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def cheapest(self, costs: Mapping[str, float | None] | None = None) -> str | None:
        """The option of least cost (``costs`` by name, default: each option's at peak), ties by
        :data:`PREFERENCE`; None when none is available."""
        if costs is None:
            costs = {o.name: o.cost_peak for o in self.options if not o.unavailable}
        known = {k: v for k, v in costs.items() if v is not None}
        if not known:
            return None
        return min(known, key=lambda n: (round(known[n], 6), PREFERENCE.get(self.option(n).kind, 9), n))


def average_of(svc: Service) -> float:
    return svc.peak_rps if svc.average_rps is None else svc.average_rps


def min_replicas_for(plan: Plan, svc: Service) -> int:
    """The service's replicas per half at least: its own ``min_replicas``, else the cluster's."""
    return plan.cluster.min_replicas if svc.min_replicas is None else svc.min_replicas


Traffic = Mapping[str, tuple[float, float]]
"""Requests/s per service: (peak, average)."""


class _Unavailable(Exception):
    pass


class _Builder:
    def __init__(self, plan: Plan, shapes: list[Shape], traffic: Traffic) -> None:
        self.plan = plan
        self.shapes = shapes
        self.headroom = plan.cluster.headroom
        self.traffic = traffic

    def sized(self, svc: Service, pod: PodSpec, capacity: float, note: str = "") -> Sized:
        floor = min_replicas_for(self.plan, svc)
        peak, avg = self.traffic[svc.name]
        try:
            return Sized(
                pod,
                capacity,
                replicas_for(peak, capacity, self.headroom, floor),
                replicas_for(avg, capacity, self.headroom, floor),
                peak,
                avg,
                note,
            )
        except OverflowError as exc:
            raise _TooMany(svc.name, pod.half, str(exc)) from exc

    @staticmethod
    def pod(svc: Service, half: str, r: Resolved, *, gpu_ok: bool) -> PodSpec:
        return PodSpec(svc.name, half, r.cpu, r.memory, r.accelerators, r.node_types, gpu_ok or bool(r.gpu))

    def monolith(self, s: ResolvedService, family: str) -> Sized:
        """The model and the logic workers an accelerator node holds beside it, as one pod alone on its node, on
        the node type that serves the peak for least."""
        svc, model = s.service, s.model_for(family)
        logic = s.halves.get("logic")
        floor, (peak, _) = min_replicas_for(self.plan, svc), self.traffic[svc.name]
        best: tuple[float, str, PodSpec, float, str] | None = None
        for shape in self.shapes:
            probe = PodSpec(svc.name, "model", model.cpu, model.memory, model.accelerators, model.node_types, True)
            if not shape.accelerators or not shape.holds(probe):
                continue
            if logic is None:
                workers, capacity, cpu, memory = 0, model.capacity.rps, model.cpu, model.memory
            else:
                if logic.node_types is not None and shape.name not in logic.node_types:
                    continue
                room = [(shape.cpu - model.cpu) // logic.cpu if logic.cpu else MAX_PODS,
                        (shape.memory - model.memory) // logic.memory if logic.memory else MAX_PODS]  # fmt: skip
                busy = math.ceil(model.capacity.rps / logic.capacity.rps - 1e-9)
                workers = min(*room, busy)
                if workers < 1:
                    continue
                capacity = min(model.capacity.rps, workers * logic.capacity.rps)
                cpu, memory = model.cpu + workers * logic.cpu, model.memory + workers * logic.memory
            pod = PodSpec(svc.name, "monolith" if logic else "model", cpu, memory, model.accelerators,
                          frozenset({shape.name}), True, True)  # fmt: skip
            try:
                cost = replicas_for(peak, capacity, self.headroom, floor) * shape.price
            except OverflowError as exc:
                raise _TooMany(svc.name, pod.half, str(exc)) from exc
            note = f"{workers} logic worker(s) beside the model" if logic else ""
            if best is None or (cost, shape.name) < best[:2]:
                best = (cost, shape.name, pod, capacity, note)
        if best is None:
            raise _Unavailable(f"{svc.name}: no accelerator node type holds its model with a logic worker beside it")
        return self.sized(svc, best[2], best[3], best[4])

    def split(self, s: ResolvedService, family: str, *, models: bool = True, gpu_ok: bool = True,
              on_cpu: bool = False) -> list[Sized]:  # fmt: skip
        svc, out = s.service, []
        for key, r in s.halves.items():
            if key == "model":
                if not models:
                    continue
                r = s.model_for(family)
                if on_cpu and r.gpu:
                    if r.on_cpu is None:
                        raise _Unavailable(f"{svc.name}'s model needs an accelerator and has no model.on_cpu")
                    r = r.on_cpu
            out.append(self.sized(svc, self.pod(svc, key, r, gpu_ok=gpu_ok), r.capacity.rps))
        return out

    def shared(self, services: list[ResolvedService], family: str) -> Sized:
        with_models = [s for s in services if "model" in s.halves]
        models = [s.model_for(family) for s in with_models]
        allowed = [m.node_types for m in models if m.node_types is not None]
        most: dict[str, int] = {}
        for m in models:
            for name, count in m.accelerators:
                most[name] = max(most.get(name, 0), count)
        pod = PodSpec("shared", "model", sum(m.cpu for m in models), sum(m.memory for m in models),
                      extended(most), frozenset.intersection(*allowed) if allowed else None, True)  # fmt: skip
        each = [self.sized(s.service, pod, s.model_for(family).capacity.rps) for s in with_models]
        busiest = max(each, key=lambda d: (d.peak, d.average))
        weights = {s.name: d.peak * (m.cpu + 1) for s, d, m in zip(with_models, each, models, strict=True)}
        total = sum(weights.values())
        shares = {k: (v / total if total else 1 / len(weights)) for k, v in weights.items()}
        return Sized(pod, busiest.capacity_rps, max(d.peak for d in each), max(d.average for d in each),
                     busiest.rps_peak, busiest.rps_average, shares=shares)  # fmt: skip


class _TooMany(Exception):
    def __init__(self, service: str, half: str, need: str) -> None:
        self.service, self.half, self.need = service, half, need
        super().__init__(service)


def _no_fit(exc: NoFit) -> str:
    p = exc.pod
    allowed = [s for s in exc.shapes if s.allows(p)] or list(exc.shapes)
    biggest = max(allowed, key=lambda s: (s.gpu, s.cpu, s.memory))
    acc = "".join(f", {k} {v}" for k, v in p.accelerators)
    want = f"cpu {format_cpu(p.cpu)}, memory {format_memory(p.memory)}{acc}"
    limit = f" (only {sorted(p.node_types)} allowed)" if p.node_types is not None else ""
    room = "".join(f", {k} {v}" for k, v in biggest.accelerators) or ", no accelerator"
    return (
        f"{p.label}: a pod requests {want}, which no node type holds{limit}; the largest it may use, "
        f"{biggest.name}, leaves pods cpu {format_cpu(biggest.cpu)}, memory {format_memory(biggest.memory)}{room} "
        "after the reservation and the DaemonSets: lower the pod's requests or add a node type that holds it"
    )


def families_of(services: list[ResolvedService]) -> list[str]:
    """The variant names of the accelerated services, in order of appearance (one family per name)."""
    out: list[str] = []
    for s in services:
        if s.accelerated:
            out += [name for name, r in s.variants.items() if r.gpu and name not in out]
    return out or [""]


def build_option(plan: Plan, shapes: list[Shape], services: list[ResolvedService], kind: str, family: str,
                 traffic: Traffic, at: tuple[str, ...] = ("peak", "average"), name: str = "") -> Option:  # fmt: skip
    """One option sized for ``traffic`` and packed at peak and/or average; raises :class:`NoFit` when one of its
    pods fits no node, :class:`PlanError` when a Deployment needs more than :data:`MAX_PODS` replicas."""
    title = KINDS[kind] + (f"; models on {family}" if family and kind != "cpu-only" else "")
    option = Option(name or kind, title, kind, "" if kind == "cpu-only" else family)
    b = _Builder(plan, shapes, traffic)
    try:
        if kind == "cpu-only":
            option.deployments = [d for s in services for d in b.split(s, family, gpu_ok=False, on_cpu=True)]
        elif kind == "monolith-per-gpu-node":
            option.deployments = [
                d
                for s in services
                for d in ([b.monolith(s, family)] if s.accelerated else b.split(s, family, gpu_ok=False))
            ]
        elif kind == "split-packed":
            option.deployments = [d for s in services for d in b.split(s, family)]
        else:
            if not any("model" in s.halves for s in services):
                raise _Unavailable("no service has a model half")
            option.deployments = [d for s in services for d in b.split(s, family, models=False)]
            option.deployments.append(b.shared(services, family))
        usable = [s for s in shapes if not s.accelerators] if kind == "cpu-only" else shapes
        if not usable:
            raise _Unavailable("no CPU node type on offer")
        check_fits([d.pod for d in option.deployments], usable)  # with no replicas too
        if "peak" in at:
            option.nodes_peak = cheapest_packing([(d.pod, d.peak) for d in option.deployments], usable)
        if "average" in at:
            option.nodes_average = cheapest_packing([(d.pod, d.average) for d in option.deployments], usable)
    except _Unavailable as exc:
        option.unavailable = str(exc)
    except _TooMany as exc:
        i = next(i for i, s in enumerate(services) if s.name == exc.service)
        raise PlanError(
            f"services[{i}] ({exc.service}): {exc.service}/{exc.half}: its traffic over its capacity per pod asks "
            f"for {exc.need} pods, more than the {MAX_PODS:.0e} this planner sizes: check peak_rps and capacity "
            "(rps per pod)"
        ) from exc
    return option


def traffic_of(services: list[ResolvedService], scale: float = 1.0) -> dict[str, tuple[float, float]]:
    return {s.name: (s.service.peak_rps * scale, average_of(s.service) * scale) for s in services}


def plan_options(plan: Plan, base: Path, source: str = "plan") -> Planned:
    """Resolve capacities and build every option of every family. :class:`PlanError` for bad input and for a
    split pod (the pods the plan deploys) that fits no node; an option whose own pods fit nowhere is marked
    unavailable."""
    services = resolve(plan, base, source)
    shapes = [shape_of(n, plan.cluster) for n in plan.node_types]
    families = families_of(services)
    traffic = traffic_of(services)
    options = []
    for kind in KINDS:
        for family in families if kind != "cpu-only" else [families[0]]:
            name = kind if len(families) == 1 or kind == "cpu-only" else f"{kind}@{family}"
            try:
                option = build_option(plan, shapes, services, kind, family, traffic, name=name)
            except NoFit as exc:
                if kind == "split-packed":
                    i = next(i for i, s in enumerate(services) if s.name == exc.pod.service)
                    raise PlanError(f"{source}: services[{i}] ({exc.pod.service}): {_no_fit(exc)}") from exc
                option = Option(name, KINDS[kind], kind, family, unavailable=_no_fit(exc))
            except PlanError as exc:
                raise PlanError(f"{source}: {exc}") from exc
            options.append(option)
    return Planned(plan, services, shapes, options, [f for f in families if f])


def with_capacity(services: list[ResolvedService], service: str, variant: str, rps: float) -> list[ResolvedService]:
    """The services with one model variant's capacity per pod replaced (for the break-even search)."""
    out = []
    for s in services:
        if s.name == service:
            r = s.variants[variant]
            new = replace(r, capacity=replace(r.capacity, rps=rps))
            variants = {k: (new if k == variant else v) for k, v in s.variants.items()}
            halves = dict(s.halves)
            if halves["model"].variant == variant:
                halves["model"] = new
            s = ResolvedService(s.service, halves, variants)
        out.append(s)
    return out
