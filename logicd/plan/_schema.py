"""The plan file of ``logicd plan``: msgspec structs (unknown fields refused), Kubernetes quantities, and
:class:`PlanError`, whose message names the file, the field and what to change.

Quantities are held as integers: CPU in millicores, memory in bytes, so that "exactly full" is exact.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from ._quantities import count_of, cpu_millis, format_cpu, format_memory, memory_bytes

__all__ = [
    "Capacity",
    "Cluster",
    "Half",
    "NodeType",
    "Plan",
    "PlanError",
    "Resources",
    "Service",
    "Variant",
    "cpu_millis",
    "format_cpu",
    "format_memory",
    "load_plan",
    "memory_bytes",
    "parse_plan",
]


class PlanError(ValueError):
    """A plan that cannot be planned: ``str()`` names the file, the field (or service) and what to change."""


# --- the structs ------------------------------------------------------------------------------------------

Quantity = str | float

GPU = "nvidia.com/gpu"
"""The resource that ``gpu:`` and ``gpus:`` count (NVIDIA's device plugin)."""

_EXTENDED = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class _Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base: immutable, keyword-only, unknown fields refused."""


class Resources(_Struct, frozen=True, kw_only=True):
    """A pod's Kubernetes requests (what the scheduler packs by)."""

    cpu: Quantity
    """CPU request: ``2``, ``0.5`` or ``"500m"``."""
    memory: Quantity
    """Memory request with a unit: ``"4Gi"``."""
    gpu: Annotated[int, msgspec.Meta(ge=0)] = 0
    """``nvidia.com/gpu``: whole GPUs; a pod with GPUs goes onto GPU nodes only."""
    accelerators: dict[str, int] | None = None
    """Any extended resource by its device plugin's name: ``{aws.amazon.com/neuron: 1}``,
    ``{nvidia.com/mig-1g.10gb: 1}``; a pod that requests one goes only onto nodes that offer it."""

    def extended(self) -> dict[str, int]:
        """Every extended resource requested (``gpu`` as ``nvidia.com/gpu``), zero counts left out."""
        out = {k: v for k, v in (self.accelerators or {}).items() if v}
        if self.gpu:
            out[GPU] = self.gpu
        return out


class Capacity(_Struct, frozen=True, kw_only=True):
    """Requests per second one pod serves within the latency budget: measured by the sweep, or given by hand."""

    sweep: str | None = None
    """A ``python -m loadtests.sweep`` output folder (or its results.json), relative to the plan file: the
    best error-free row whose p99 is within the service's latency budget."""
    rps: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """Requests/s per pod, measured by hand (the model half: inferences/s; see ``inferences_per_request``)."""
    p50_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """With ``rps``: the p50 latency at that rate (for the KEDA queue targets)."""
    p99_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """With ``rps``: the p99 latency at that rate (checked against the latency budget)."""


class OnCpu(_Struct, frozen=True, kw_only=True):
    """How a GPU model runs without a GPU: what the ``cpu-only`` option (the deployment before a move to GPUs) uses."""

    resources: Resources
    capacity: Capacity


class Variant(_Struct, frozen=True, kw_only=True):
    """The model on one accelerator (or node type): its requests and the capacity measured there. Variants of
    the same ``name`` across services make one family of options (``split-packed@NAME``)."""

    name: str
    """A short label: ``t4-trt``, ``inferentia``; the options of its family carry it."""
    node_types: list[str] | None = None
    """Where it was measured and may run; required when the node types offering its accelerator differ."""
    resources: Resources
    capacity: Capacity | None = None
    ingest_workers: Annotated[int, msgspec.Meta(ge=0, le=1024)] | None = None
    """modelsvc's ``--workers`` the capacity was measured with (ingest processes beside the one that owns the
    models): the model pod requests at least one CPU for each and one for the engine, and the values set it."""


class Half(_Struct, frozen=True, kw_only=True):
    """One half of a service (its logic pods or its model pods), or a whole CPU service."""

    resources: Resources | None = None
    """Required, but for a model given as ``variants``."""
    capacity: Capacity | None = None
    """Missing: an error that says what to measure."""
    inferences_per_request: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Model calls one service request makes (windows of a long document): capacity in requests/s is the
    measured inferences/s divided by this."""
    node_types: list[str] | None = None
    """The node types these pods may run on (default: any that fits)."""
    on_cpu: OnCpu | None = None
    """For a GPU model: its CPU variant, for the ``cpu-only`` option."""
    variants: list[Variant] | None = None
    """For a model: one entry per accelerator it was measured on, compared in one run (instead of
    ``resources``, ``capacity`` and ``node_types``)."""
    ingest_workers: Annotated[int, msgspec.Meta(ge=0, le=1024)] | None = None
    """modelsvc's ``--workers`` the capacity was measured with (ingest processes beside the one that owns the
    models): the model pod requests at least one CPU for each and one for the engine, and the values set it."""


class Service(_Struct, frozen=True, kw_only=True):
    """A service: a logic+model ``pair``, a ``model`` served alone, or a ``cpu`` service (one kind of pod)."""

    name: str
    kind: Literal["pair", "model", "cpu"] = "pair"
    peak_rps: Annotated[float, msgspec.Meta(ge=0)]
    """Requests/s at the busiest time: the plan is sized for it."""
    average_rps: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """Requests/s on average (default: the peak)."""
    latency_budget_ms: Annotated[float, msgspec.Meta(gt=0)]
    """p99 the service must keep; the model's measured p99 must fit within it."""
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Per half (default: cluster.min_replicas)."""
    unit: str = "req"
    """What one request is, for the break-even lines: ``document`` reads "1.4 document/s per pod"."""
    logic: Half | None = None
    """kind pair: the logic pods (logicd)."""
    model: Half | None = None
    """kind pair or model: the model pods (modelsvc or Triton)."""
    pod: Half | None = None
    """kind cpu: the service's pods."""


class NodeType(_Struct, frozen=True, kw_only=True):
    """A node type on offer, with its public on-demand price."""

    name: str
    vcpus: Annotated[float, msgspec.Meta(gt=0)]
    memory: Quantity
    gpus: Annotated[int, msgspec.Meta(ge=0)] = 0
    """``nvidia.com/gpu`` devices."""
    gpu_model: str = ""
    """The GPU's name (T4, A10G): the label of its accelerator."""
    accelerators: dict[str, int] | None = None
    """Other extended resources the node offers: ``{aws.amazon.com/neuron: 1}``, MIG profiles."""
    accelerator: str = ""
    """The accelerator's name (Inferentia); ``gpu_model`` is its older spelling."""
    price_per_hour: Annotated[float, msgspec.Meta(ge=0)]
    allocatable: Resources | None = None
    """What pods may request (Kubernetes' allocatable); default: capacity less the kubelet's reservation."""
    max_pods: Annotated[int, msgspec.Meta(ge=1)] = 110

    def extended(self) -> dict[str, int]:
        out = {k: v for k, v in (self.accelerators or {}).items() if v}
        if self.gpus:
            out[GPU] = self.gpus
        return out

    @property
    def label(self) -> str:
        """The accelerator's name, else its resources' names; "" for a CPU node."""
        return self.accelerator or self.gpu_model or ", ".join(sorted(self.extended()))


class Overhead(_Struct, frozen=True, kw_only=True):
    cpu: Quantity = 0
    memory: Quantity = "0Mi"


class Cluster(_Struct, frozen=True, kw_only=True):
    headroom: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.25
    """Share of each pod's capacity kept free at peak: replicas = ceil(peak / (capacity x (1 - headroom)))."""
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] = 2
    """Replicas per half at least (availability); a zero-traffic service still gets them."""
    kubelet_reservation: Literal["gke", "eks"] = "gke"
    """Whose published kubelet reservation a node loses when its type gives no ``allocatable``: GKE's tiers,
    or EKS's (the same CPU tiers; memory 11 MiB per pod of max_pods plus 255 MiB)."""
    daemonsets: Overhead = Overhead(cpu="300m", memory="512Mi")
    """Requests of the DaemonSets every node runs (CNI, kube-proxy, log and metrics agents)."""
    gpu_daemonsets: Overhead = Overhead(cpu="200m", memory="512Mi")
    """More on accelerator nodes: device plugin, GPU feature discovery, DCGM or Neuron monitor."""


class Plan(_Struct, frozen=True, kw_only=True):
    prices_as_of: str = ""
    """When the prices were read (they are to be edited)."""
    cluster: Cluster = Cluster()
    node_types: list[NodeType]
    services: list[Service]


# --- loading ----------------------------------------------------------------------------------------------

_AT = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)


def _translate(exc: msgspec.ValidationError, data: dict[str, object]) -> str:
    """msgspec's message in plan words: ``services[0] (name: x).logic: unknown field `cpus```."""
    match = _AT.match(str(exc))
    reason, where = (match.group(1), match.group(2) or "") if match else (str(exc), "")
    reason = reason.replace("Object contains unknown field", "unknown field").replace("Object missing", "missing")
    reason = reason.replace("Expected", "expected")
    where = where.lstrip(".")
    named = re.match(r"(services|node_types)\[(\d+)\]", where)
    if named:
        items = data.get(named.group(1))
        index = int(named.group(2))
        if isinstance(items, list) and index < len(items) and isinstance(items[index], dict):
            name = items[index].get("name")
            if isinstance(name, str):
                where = f"{named.group(0)} ({name})" + where[named.end() :]
    if where.endswith(".kind") and reason.startswith("Invalid enum value"):
        reason = f"{reason[len('Invalid enum value ') :]} is not a kind: pair (logic + model), model or cpu"
    return f"{where}: {reason}" if where else reason


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it, but with YAML 1.2's floats: ``1e9`` and ``1e-9`` are numbers, not strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_plan(path: Path) -> Plan:
    """Read and check the plan file; :class:`PlanError` names the field and what to change."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read the plan: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse_plan(text, str(path))


def parse_plan(text: str, source: str = "plan") -> Plan:
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise PlanError(f"{source}{where}: invalid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlanError(f"{source}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError(f"{source}: a plan is a mapping with node_types and services, got {type(data).__name__}")
    _finite(data, source)
    try:
        plan = msgspec.convert(data, Plan)
    except msgspec.ValidationError as exc:
        raise PlanError(f"{source}: {_translate(exc, data)}") from exc
    _check(plan, source)
    return plan


def _finite(data: Any, source: str, path: str = "", top: Any = None) -> None:
    """Every number finite: ``.inf`` and ``.nan`` are refused where they stand, before any arithmetic."""
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(value, list) and isinstance(key, str):
                for i, item in enumerate(value):
                    name = item.get("name") if isinstance(item, dict) else None
                    _finite(item, source, f"{where}[{i}]" + (f" ({name})" if isinstance(name, str) else ""))
            else:
                _finite(value, source, where)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            _finite(item, source, f"{path}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        raise PlanError(f"{source}: {path}: {data!r} is not a finite number: give the figure itself")


def _check(plan: Plan, source: str) -> None:
    """What msgspec cannot say: quantities, kinds and their halves, names, node-type references, allocatable
    within capacity, accelerators that some node offers."""

    def fail(where: str, what: str) -> None:
        raise PlanError(f"{source}: {where}: {what}")

    def extended(where: str, given: dict[str, int] | None) -> None:
        for name, count in (given or {}).items():
            if not _EXTENDED.fullmatch(name) or name.split("/")[0].endswith("kubernetes.io"):
                fail(
                    f"{where}.accelerators",
                    f"{name!r} is not an extended resource name like 'nvidia.com/gpu' "
                    "or 'aws.amazon.com/neuron' (domain/name, as the device plugin advertises it)",
                )
            try:
                count_of(count, f"{name}")
            except ValueError as exc:
                fail(f"{where}.accelerators.{name}", str(exc))

    def resources(where: str, r: Resources) -> tuple[int, int]:
        try:
            cpu = cpu_millis(r.cpu)
        except ValueError as exc:
            fail(f"{where}.cpu", str(exc))
        try:
            memory = memory_bytes(r.memory)
        except ValueError as exc:
            fail(f"{where}.memory", str(exc))
        extended(where, r.accelerators)
        if r.gpu and (r.accelerators or {}).get(GPU):
            fail(where, f"give GPUs as `gpu: N` or as `accelerators: {{{GPU}: N}}`, not both")
        return cpu, memory

    if not plan.node_types:
        fail("node_types", "empty: list the node types on offer")
    if not plan.services:
        fail("services", "empty: list the services to plan")
    names: dict[str, NodeType] = {}
    for i, node in enumerate(plan.node_types):
        where = f"node_types[{i}] ({node.name})"
        if not node.name:
            fail(f"node_types[{i}].name", "empty: name the node type (its instance type)")
        if node.name in names:
            fail(where, f"node type {node.name!r} is listed twice")
        names[node.name] = node
        try:
            memory = memory_bytes(node.memory)
        except ValueError as exc:
            fail(f"{where}.memory", str(exc))
        extended(where, node.accelerators)
        if node.gpus and (node.accelerators or {}).get(GPU):
            fail(where, f"give GPUs as `gpus: N` or as `accelerators: {{{GPU}: N}}`, not both")
        if node.gpu_model and node.accelerator and node.gpu_model != node.accelerator:
            fail(where, f"gpu_model {node.gpu_model!r} and accelerator {node.accelerator!r} differ: give one")
        if node.vcpus * 1000 > 10**15:
            fail(f"{where}.vcpus", f"{node.vcpus:g} vCPUs is beyond any node")
        if node.allocatable is not None:
            a_cpu, a_memory = resources(f"{where}.allocatable", node.allocatable)
            if a_cpu > round(node.vcpus * 1000):
                fail(
                    f"{where}.allocatable.cpu",
                    f"{format_cpu(a_cpu)} CPUs is more than the node's {node.vcpus:g} "
                    "vCPUs (allocatable is capacity less the reservation; millicores are written '3920m')",
                )
            if a_memory > memory:
                fail(
                    f"{where}.allocatable.memory",
                    f"{format_memory(a_memory)} is more than the node's memory {node.memory}",
                )
            offered = node.extended()
            for name, count in node.allocatable.extended().items():
                if count > offered.get(name, 0):
                    fail(f"{where}.allocatable", f"{name}: {count} is more than the node's {offered.get(name, 0)}")
    for key, overhead in (("daemonsets", plan.cluster.daemonsets), ("gpu_daemonsets", plan.cluster.gpu_daemonsets)):
        resources(f"cluster.{key}", Resources(cpu=overhead.cpu, memory=overhead.memory))
    seen: set[str] = set()
    halves = {"pair": ("logic", "model"), "model": ("model",), "cpu": ("pod",)}
    for i, svc in enumerate(plan.services):
        where = f"services[{i}] ({svc.name})"
        if not svc.name:
            fail(f"services[{i}].name", "empty: name the service")
        if svc.name in seen:
            fail(where, f"service {svc.name!r} is listed twice")
        seen.add(svc.name)
        if svc.average_rps is not None and svc.average_rps > svc.peak_rps:
            fail(f"{where}.average_rps", f"{svc.average_rps:g} is above peak_rps {svc.peak_rps:g}")
        wanted = halves[svc.kind]
        for key in ("logic", "model", "pod"):
            half = getattr(svc, key)
            if key in wanted and half is None:
                fail(where, f"kind {svc.kind} needs `{key}` (its resources and capacity)")
            if key not in wanted and half is not None:
                fail(f"{where}.{key}", f"kind {svc.kind} has no {key}; it has {' and '.join(wanted)}")
            if half is not None:
                _check_half(half, f"{where}.{key}", key, names, resources, fail)


def _check_half(half: Half, where: str, key: str, names: dict[str, NodeType], resources: Any, fail: Any) -> None:
    if half.variants is not None:
        if key != "model":
            fail(f"{where}.variants", "only a model half has variants (one per accelerator it was measured on)")
        if not half.variants:
            fail(f"{where}.variants", "empty: give one variant per accelerator, or resources and capacity")
        for field in ("resources", "capacity", "node_types"):
            if getattr(half, field) is not None:
                fail(f"{where}.{field}", "give it inside each of `variants`, not beside them")
    elif half.resources is None:
        fail(where, "missing `resources` (the pod's Kubernetes requests)")
    own = [] if half.resources is None else [("", half.resources, half.node_types)]
    entries = own + [
        (f".variants[{j}] ({v.name})", v.resources, v.node_types) for j, v in enumerate(half.variants or [])
    ]
    labels: set[str] = set()
    for j, v in enumerate(half.variants or []):
        if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.+]*", v.name):
            fail(f"{where}.variants[{j}].name", f"{v.name!r}: a short label of letters, digits and -_.+ (t4-trt)")
        if v.name in labels:
            fail(f"{where}.variants[{j}]", f"variant {v.name!r} is listed twice")
        labels.add(v.name)
    for at, r, allowed in entries:
        here = f"{where}{at}"
        resources(f"{here}.resources", r)
        wants = r.extended()
        if key != "model" and wants:
            fail(f"{here}.resources", "only a model half takes GPUs or other accelerators")
        for n in allowed or []:
            if n not in names:
                fail(f"{here}.node_types", f"unknown node type {n!r}; node_types lists {sorted(names)}")
            missing = [k for k, c in wants.items() if names[n].extended().get(k, 0) < c]
            if missing:
                fail(
                    f"{here}.node_types",
                    f"{n} offers no {missing[0]}: {missing[0]} {wants[missing[0]]} "
                    "per pod needs a node type that has it",
                )
        if wants and allowed is None:
            offering = {
                names[n].label for n in names if all(names[n].extended().get(k, 0) >= c for k, c in wants.items())
            }
            if len(offering) > 1:
                fail(
                    f"{here}.node_types",
                    f"missing: node types with {', '.join(sorted(wants))} carry "
                    f"{' and '.join(sorted(offering))}, whose throughput differs; name the ones this capacity "
                    "was measured on (or give one variant per accelerator)",
                )
    if key != "model" and half.inferences_per_request != 1.0:
        fail(f"{where}.inferences_per_request", "only a model half has it; give capacity in requests/s")
    if half.on_cpu is not None:
        accelerated = any(r.extended() for _, r, _ in entries)
        if key != "model" or not accelerated:
            fail(f"{where}.on_cpu", "only a GPU model has a CPU variant")
        resources(f"{where}.on_cpu.resources", half.on_cpu.resources)
        if half.on_cpu.resources.extended():
            fail(f"{where}.on_cpu.resources", "the CPU variant takes no GPU or other accelerator")
