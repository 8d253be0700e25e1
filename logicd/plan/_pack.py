"""Bin packing of pods onto nodes by their Kubernetes requests (cpu, memory, any extended resource such as
``nvidia.com/gpu`` or ``aws.amazon.com/neuron``), first-fit decreasing, with the node type of every newly
opened node searched for the cheapest total.

- A node's room is its allocatable (capacity less the kubelet's reservation, GKE's or EKS's published formula
  unless the node type gives ``allocatable``) less the DaemonSets' requests (more on accelerator nodes), at
  most ``max_pods`` pods (DaemonSet pods not counted).
- Accelerated pods go onto nodes that offer their resource; other pods go onto accelerator nodes only when they
  tolerate those nodes' taint.
- An ``exclusive`` pod takes a node of its own (a monolith per GPU node).

The packing is in closed form: nodes are held as groups of identical nodes (``Node.count``), and the identical
pods of one Deployment are placed together, so the work grows with the Deployments and the node types, not with
the number of pods: 10^9 requests/s plans as fast as 10. It is the same first-fit decreasing as placing the
pods one by one (identical pods fill a node to what it holds, then the next).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ._quantities import cpu_millis, memory_bytes
from ._schema import Cluster, NodeType

__all__ = [
    "NoFit",
    "Node",
    "PodSpec",
    "Shape",
    "cheapest_packing",
    "check_fits",
    "expand",
    "pack",
    "reserved_cpu",
    "reserved_memory",
    "shape_of",
    "shrink",
]

GiB = 2**30
MiB = 2**20

Extended = tuple[tuple[str, int], ...]
"""Extended resources (``nvidia.com/gpu``, ``aws.amazon.com/neuron``) as sorted (name, count) pairs."""


def extended(given: dict[str, int]) -> Extended:
    return tuple(sorted((k, v) for k, v in given.items() if v))


@dataclass(frozen=True)
class PodSpec:
    """One kind of pod to place (a Deployment's pods are all alike)."""

    service: str
    half: str
    cpu: int
    """millicores"""
    memory: int
    """bytes"""
    accelerators: Extended = ()
    node_types: frozenset[str] | None = None
    """Allowed node types; None: any."""
    tolerates_gpu_nodes: bool = False
    """Tolerates accelerator nodes' taints (a pod that requests an accelerator always does)."""
    exclusive: bool = False

    @property
    def label(self) -> str:
        return f"{self.service}/{self.half}"

    @property
    def gpu(self) -> int:
        """Accelerator devices requested, all kinds together (0: a CPU pod)."""
        return sum(v for _, v in self.accelerators)


@dataclass(frozen=True)
class Shape:
    """A node type's room for pods, after the kubelet's reservation and the DaemonSets."""

    name: str
    cpu: int
    memory: int
    accelerators: Extended
    max_pods: int
    price: float
    vcpus: float
    memory_capacity: int
    label: str = ""
    """The accelerator's name (T4, Inferentia); "" for a CPU node."""

    @property
    def gpu(self) -> int:
        """Accelerator devices, all kinds together (0: a CPU node)."""
        return sum(v for _, v in self.accelerators)

    def room(self, name: str) -> int:
        for key, count in self.accelerators:
            if key == name:
                return count
        return 0

    def allows(self, pod: PodSpec) -> bool:
        """Whether the pod may run here at all (node types, taints), whatever its size."""
        if pod.node_types is not None and self.name not in pod.node_types:
            return False
        return not (self.accelerators and not pod.accelerators and not pod.tolerates_gpu_nodes)

    def per_node(self, pod: PodSpec) -> int:
        """How many of the pod an empty node of this type holds."""
        if not self.allows(pod):
            return 0
        k = _take(self.cpu, self.memory, dict(self.accelerators), self.max_pods, pod)
        return min(k, 1) if pod.exclusive else k

    def holds(self, pod: PodSpec) -> bool:
        """Whether an empty node of this type takes the pod."""
        return self.per_node(pod) >= 1


def _take(cpu: int, memory: int, acc: dict[str, int], slots: int, pod: PodSpec) -> int:
    """How many of the pod fit in the room left (cpu, memory, extended resources, pod slots)."""
    k = slots
    if pod.cpu:
        k = min(k, cpu // pod.cpu)
    if pod.memory:
        k = min(k, memory // pod.memory)
    for name, count in pod.accelerators:
        k = min(k, acc.get(name, 0) // count)
    return max(k, 0)


def _tiered(amount: int, tiers: Sequence[tuple[float, float]]) -> int:
    """The sum, rounded up, of each tier's share of the part of ``amount`` that falls in it (tiers in order)."""
    out, left = 0.0, float(amount)
    for size, share in tiers:
        take = min(left, size)
        out += take * share
        left -= take
    return math.ceil(out)


def reserved_cpu(millis: int) -> int:
    """The kubelet's CPU reservation, GKE's and EKS's alike: 6 % of the first core, 1 % of the second, 0.5 % of
    the next two, 0.25 % of the rest."""
    return _tiered(millis, [(1000, 0.06), (1000, 0.01), (2000, 0.005), (math.inf, 0.0025)])


def reserved_memory(nbytes: int, kind: str = "gke", max_pods: int = 110) -> int:
    """The kubelet's memory reservation plus the 100 MiB eviction threshold. GKE: 25 % of the first 4 GiB, 20 %
    of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128 GiB (255 MiB under 1 GiB). EKS (its
    AMI's bootstrap): 11 MiB per pod the node may run plus 255 MiB."""
    if kind == "eks":
        return (11 * max_pods + 255) * MiB + 100 * MiB
    if nbytes < GiB:
        return 255 * MiB + 100 * MiB
    tiers = [(4 * GiB, 0.25), (4 * GiB, 0.20), (8 * GiB, 0.10), (112 * GiB, 0.06), (math.inf, 0.02)]
    return _tiered(nbytes, tiers) + 100 * MiB


def shape_of(node: NodeType, cluster: Cluster) -> Shape:
    capacity_cpu = round(node.vcpus * 1000)
    capacity_mem = memory_bytes(node.memory)
    acc = node.extended()
    if node.allocatable is not None:
        cpu, mem = cpu_millis(node.allocatable.cpu), memory_bytes(node.allocatable.memory)
        acc.update(node.allocatable.extended())
    else:
        cpu = capacity_cpu - reserved_cpu(capacity_cpu)
        mem = capacity_mem - reserved_memory(capacity_mem, cluster.kubelet_reservation, node.max_pods)
    overheads = [cluster.daemonsets] + ([cluster.gpu_daemonsets] if acc else [])
    for o in overheads:
        cpu -= cpu_millis(o.cpu)
        mem -= memory_bytes(o.memory)
    return Shape(
        node.name,
        max(cpu, 0),
        max(mem, 0),
        extended(acc),
        node.max_pods,
        node.price_per_hour,
        node.vcpus,
        capacity_mem,
        node.label,
    )


@dataclass
class Node:
    """``count`` identical nodes of one type, each holding ``pods`` (pod kind -> how many on each node)."""

    shape: Shape
    count: int = 1
    pods: dict[PodSpec, int] = field(default_factory=dict)
    cpu: int = 0
    memory: int = 0
    accelerators: dict[str, int] = field(default_factory=dict)
    slots: int = 0
    """Pods on each node."""
    exclusive: bool = False
    """Holds an exclusive pod (and nothing else)."""

    @property
    def gpu(self) -> int:
        return sum(self.accelerators.values())

    def copy(self, count: int) -> Node:
        return Node(self.shape, count, dict(self.pods), self.cpu, self.memory, dict(self.accelerators), self.slots,
                    self.exclusive)  # fmt: skip

    def room_for(self, pod: PodSpec) -> int:
        """How many more of the pod each node of the group takes."""
        s = self.shape
        if self.exclusive or (pod.exclusive and self.slots) or not s.allows(pod):
            return 0
        k = s.max_pods - self.slots
        if pod.cpu:
            k = min(k, (s.cpu - self.cpu) // pod.cpu)
        if pod.memory:
            k = min(k, (s.memory - self.memory) // pod.memory)
        for name, count in pod.accelerators:
            k = min(k, (s.room(name) - self.accelerators.get(name, 0)) // count)
        k = max(k, 0)
        return min(k, 1) if pod.exclusive else k

    def add(self, pod: PodSpec, n: int = 1) -> None:
        """``n`` more of the pod on each node of the group."""
        self.pods[pod] = self.pods.get(pod, 0) + n
        self.cpu += pod.cpu * n
        self.memory += pod.memory * n
        for name, count in pod.accelerators:
            self.accelerators[name] = self.accelerators.get(name, 0) + count * n
        self.slots += n
        self.exclusive = self.exclusive or pod.exclusive


def expand(nodes: Iterable[Node]) -> list[Node]:
    """The groups as single nodes (for small plans: tests, the picture's first nodes)."""
    return [n.copy(1) for n in nodes for _ in range(n.count)]


class NoFit(Exception):
    """A pod that no node type on offer holds."""

    def __init__(self, pod: PodSpec, shapes: Sequence[Shape]) -> None:
        self.pod = pod
        self.shapes = list(shapes)
        super().__init__(pod.label)


def _order(pod: PodSpec) -> tuple[int, int, int, int]:
    return (pod.gpu, int(pod.exclusive), pod.cpu, pod.memory)


def pack(pods: Sequence[tuple[PodSpec, int]], nodes: list[Node], opener: Callable[[PodSpec], Shape]) -> list[Node]:
    """First-fit decreasing of ``(pod, how many)``: each kind (largest first) onto the first nodes with room, each
    filled to what it holds, the rest onto new nodes of the type ``opener`` names. ``nodes`` (already open) are
    filled first and are part of the result."""
    merged: dict[PodSpec, int] = {}
    for pod, n in pods:
        if n > 0:
            merged[pod] = merged.get(pod, 0) + n
    for pod in sorted(merged, key=_order, reverse=True):
        n = merged[pod]
        i = 0
        while n > 0 and i < len(nodes):
            group = nodes[i]
            k = group.room_for(pod)
            if k == 0:
                i += 1
                continue
            full = min(group.count, n // k)
            if full == group.count:
                group.add(pod, k)
                n -= full * k
                i += 1
                continue
            rest = n - full * k  # 0 <= rest < k: one node takes it, the group's other nodes stay as they were
            parts = []
            if full:
                done = group.copy(full)
                done.add(pod, k)
                parts.append(done)
            if rest:
                one = group.copy(1)
                one.add(pod, rest)
                parts.append(one)
            untouched = group.count - full - (1 if rest else 0)
            if untouched:
                parts.append(group.copy(untouched))
            nodes[i : i + 1] = parts
            n = 0
        if n > 0:
            shape = opener(pod)
            k = shape.per_node(pod)
            full, rest = divmod(n, k)
            if full:
                group = Node(shape, full)
                group.add(pod, k)
                nodes.append(group)
            if rest:
                group = Node(shape, 1)
                group.add(pod, rest)
                nodes.append(group)
    return nodes


def _holds_all(shape: Shape, node: Node) -> bool:
    if any(not shape.allows(p) for p in node.pods):
        return False
    if node.slots > shape.max_pods or node.cpu > shape.cpu or node.memory > shape.memory:
        return False
    return all(count <= shape.room(name) for name, count in node.accelerators.items())


def shrink(nodes: list[Node], shapes: Sequence[Shape]) -> list[Node]:
    """Each node as the cheapest type that still holds all its pods (the last, part-filled nodes of a packing
    often fit a smaller type)."""
    ordered = sorted(shapes, key=lambda s: (s.price, s.name))
    for node in nodes:
        for shape in ordered:
            if shape.price >= node.shape.price:
                break
            if _holds_all(shape, node):
                node.shape = shape
                break
    return nodes


def check_fits(pods: Iterable[PodSpec], shapes: Sequence[Shape]) -> None:
    """:class:`NoFit` for the first pod that no node type holds."""
    for pod in pods:
        if not any(s.holds(pod) for s in shapes):
            raise NoFit(pod, shapes)


def cheapest_packing(pods: Sequence[tuple[PodSpec, int]], shapes: Sequence[Shape]) -> list[Node]:
    """The cheapest FFD packing over the choices of one accelerator node type (for accelerated pods) and one CPU
    node type (for CPU pods that find no room); a pod whose chosen type does not hold it opens the cheapest type
    that does. Accelerated pods are placed first, so CPU pods fill the accelerator nodes' spare room before CPU
    nodes are opened; then each node becomes the cheapest type that holds its pods (:func:`shrink`).
    Raises :class:`NoFit` for a pod that no type holds."""
    check_fits((p for p, n in pods if n > 0), shapes)
    acc_pods = [(p, n) for p, n in pods if p.gpu and n > 0]
    cpu_pods = [(p, n) for p, n in pods if not p.gpu and n > 0]
    acc_choices: list[Shape | None] = [None]
    if acc_pods:
        acc_choices = [s for s in shapes if s.accelerators and any(s.holds(p) for p, _ in acc_pods)] or [None]
    cpu_choices: list[Shape | None] = [s for s in shapes if not s.accelerators] or [None]
    cheapest: dict[PodSpec, Shape] = {}
    for p, _ in pods:
        if p not in cheapest:
            holders = [s for s in shapes if s.holds(p)]
            if holders:
                cheapest[p] = min(holders, key=lambda s: (s.price / s.per_node(p), s.price, s.name))
    best: tuple[float, int, list[Node]] | None = None
    for g in acc_choices:
        for c in cpu_choices:

            def opener(pod: PodSpec, g: Shape | None = g, c: Shape | None = c) -> Shape:
                choice = g if pod.gpu else c
                if choice is not None and choice.holds(pod):
                    return choice
                return cheapest[pod]

            nodes = shrink(pack(cpu_pods, pack(acc_pods, [], opener), opener), shapes)
            cost = sum(n.shape.price * n.count for n in nodes)
            size = sum(n.count for n in nodes)
            if best is None or (round(cost, 6), size) < (round(best[0], 6), best[1]):
                best = (cost, size, nodes)
    assert best is not None
    return best[2]
