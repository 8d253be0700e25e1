"""The plan file of ``logicd plan``: msgspec structs (unknown fields refused), Kubernetes quantities, and
:class:`PlanError`, whose message names the file, the field and what to change.

Quantities are held as integers: CPU in millicores, memory in bytes, so that "exactly full" is exact.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

__all__ = [
    "Capacity",
    "Cluster",
    "Half",
    "NodeType",
    "Plan",
    "PlanError",
    "Resources",
    "Service",
    "cpu_millis",
    "load_plan",
    "memory_bytes",
]


class PlanError(ValueError):
    """A plan that cannot be planned: ``str()`` names the file, the field (or service) and what to change."""


# --- quantities -------------------------------------------------------------------------------------------

_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)")
_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def cpu_millis(value: str | float) -> int:
    """A Kubernetes CPU quantity (``2``, ``0.5``, ``"500m"``) in millicores; ValueError when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"a CPU quantity is a number or millicores like '500m', got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("m") and text[:-1].isdigit():
            return int(text[:-1])
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"a CPU quantity is a number or millicores like '500m', got {value!r}") from None
    if value < 0:
        raise ValueError(f"a CPU quantity is not negative, got {value!r}")
    return round(value * 1000)


def memory_bytes(value: str | float) -> int:
    """A Kubernetes memory quantity with a unit (``"512Mi"``, ``"32Gi"``) in bytes. A bare number is refused:
    Kubernetes reads it as bytes, which is never what a plan means."""
    if isinstance(value, str):
        match = _MEMORY.fullmatch(value.strip())
        if match:
            return round(float(match.group(1)) * _UNITS[match.group(2)])
    raise ValueError(f"a memory quantity has a unit, like '512Mi' or '32Gi', got {value!r}")


def format_cpu(millis: int) -> str:
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"


def format_memory(nbytes: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{-(-nbytes // 2**20)}Mi"


# --- the structs ------------------------------------------------------------------------------------------

Quantity = str | float


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


class Half(_Struct, frozen=True, kw_only=True):
    """One half of a service (its logic pods or its model pods), or a whole CPU service."""

    resources: Resources
    capacity: Capacity | None = None
    """Missing: an error that says what to measure."""
    inferences_per_request: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Model calls one service request makes (windows of a long document): capacity in requests/s is the
    measured inferences/s divided by this."""
    node_types: list[str] | None = None
    """The node types these pods may run on (default: any that fits)."""
    on_cpu: OnCpu | None = None
    """For a GPU model: its CPU variant, for the ``cpu-only`` option."""


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
    gpu_model: str = ""
    price_per_hour: Annotated[float, msgspec.Meta(ge=0)]
    allocatable: Resources | None = None
    """What pods may request (Kubernetes' allocatable); default: capacity less the GKE-style reservation."""
    max_pods: Annotated[int, msgspec.Meta(ge=1)] = 110


class Overhead(_Struct, frozen=True, kw_only=True):
    cpu: Quantity = 0
    memory: Quantity = "0Mi"


class Cluster(_Struct, frozen=True, kw_only=True):
    headroom: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.25
    """Share of each pod's capacity kept free at peak: replicas = ceil(peak / (capacity x (1 - headroom)))."""
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] = 2
    """Replicas per half at least (availability); a zero-traffic service still gets them."""
    daemonsets: Overhead = Overhead(cpu="300m", memory="512Mi")
    """Requests of the DaemonSets every node runs (CNI, kube-proxy, log and metrics agents)."""
    gpu_daemonsets: Overhead = Overhead(cpu="200m", memory="512Mi")
    """More on GPU nodes: device plugin, GPU feature discovery, DCGM exporter."""


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


def load_plan(path: Path) -> Plan:
    """Read and check the plan file; :class:`PlanError` names the field and what to change."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read the plan: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse_plan(text, str(path))


def parse_plan(text: str, source: str = "plan") -> Plan:
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise PlanError(f"{source}{where}: invalid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlanError(f"{source}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError(f"{source}: a plan is a mapping with node_types and services, got {type(data).__name__}")
    try:
        plan = msgspec.convert(data, Plan)
    except msgspec.ValidationError as exc:
        raise PlanError(f"{source}: {_translate(exc, data)}") from exc
    _check(plan, source)
    return plan


def _check(plan: Plan, source: str) -> None:
    """What msgspec cannot say: quantities, kinds and their halves, names, node-type references."""

    def fail(where: str, what: str) -> None:
        raise PlanError(f"{source}: {where}: {what}")

    def resources(where: str, r: Resources) -> None:
        try:
            cpu_millis(r.cpu)
        except ValueError as exc:
            fail(f"{where}.cpu", str(exc))
        try:
            memory_bytes(r.memory)
        except ValueError as exc:
            fail(f"{where}.memory", str(exc))

    if not plan.node_types:
        fail("node_types", "empty: list the node types on offer")
    if not plan.services:
        fail("services", "empty: list the services to plan")
    names: set[str] = set()
    for i, node in enumerate(plan.node_types):
        where = f"node_types[{i}] ({node.name})"
        if node.name in names:
            fail(where, f"node type {node.name!r} is listed twice")
        names.add(node.name)
        try:
            memory_bytes(node.memory)
        except ValueError as exc:
            fail(f"{where}.memory", str(exc))
        if node.allocatable is not None:
            resources(f"{where}.allocatable", node.allocatable)
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
            if half is None:
                continue
            resources(f"{where}.{key}.resources", half.resources)
            if key != "model" and half.resources.gpu:
                fail(f"{where}.{key}.resources.gpu", "only a model half takes GPUs")
            if key != "model" and half.inferences_per_request != 1.0:
                fail(f"{where}.{key}.inferences_per_request", "only a model half has it; give capacity in requests/s")
            for n in half.node_types or []:
                if n not in names:
                    fail(f"{where}.{key}.node_types", f"unknown node type {n!r}; node_types lists {sorted(names)}")
            if half.on_cpu is not None:
                if key != "model" or not half.resources.gpu:
                    fail(f"{where}.{key}.on_cpu", "only a GPU model has a CPU variant")
                resources(f"{where}.{key}.on_cpu.resources", half.on_cpu.resources)
                if half.on_cpu.resources.gpu:
                    fail(f"{where}.{key}.on_cpu.resources.gpu", "the CPU variant takes no GPU")
