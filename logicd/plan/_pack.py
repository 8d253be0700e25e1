"""Bin packing of pods onto nodes by their Kubernetes requests (cpu, memory, nvidia.com/gpu), first-fit
decreasing, with the node type of every newly opened node searched for the cheapest total.

- A node's room is its allocatable (capacity less the kubelet's reservation, GKE's published formula unless the
  node type gives ``allocatable``) less the DaemonSets' requests (more on GPU nodes), at most ``max_pods`` pods
  (DaemonSet pods not counted).
- GPU pods go onto GPU nodes only; CPU pods go onto GPU nodes only when they tolerate the GPU taint.
- An ``exclusive`` pod takes a node of its own (a monolith per GPU node).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ._schema import Cluster, NodeType, cpu_millis, memory_bytes

__all__ = ["NoFit", "Node", "PodSpec", "Shape", "cheapest_packing", "check_fits", "pack", "shape_of", "shrink"]

GiB = 2**30


@dataclass(frozen=True)
class PodSpec:
    """One pod to place (``count`` of them are separate pods)."""

    service: str
    half: str
    cpu: int
    """millicores"""
    memory: int
    """bytes"""
    gpu: int = 0
    node_types: frozenset[str] | None = None
    """Allowed node types; None: any."""
    tolerates_gpu_nodes: bool = False
    exclusive: bool = False

    @property
    def label(self) -> str:
        return f"{self.service}/{self.half}"


@dataclass(frozen=True)
class Shape:
    """A node type's room for pods, after the kubelet's reservation and the DaemonSets."""

    name: str
    cpu: int
    memory: int
    gpu: int
    max_pods: int
    price: float
    vcpus: float
    memory_capacity: int

    def holds(self, pod: PodSpec) -> bool:
        """Whether an empty node of this type takes the pod."""
        if pod.node_types is not None and self.name not in pod.node_types:
            return False
        if self.gpu and not pod.gpu and not pod.tolerates_gpu_nodes:
            return False
        return pod.cpu <= self.cpu and pod.memory <= self.memory and pod.gpu <= self.gpu and self.max_pods >= 1


def _tiered(amount: int, tiers: Sequence[tuple[float, float]]) -> int:
    """The sum, rounded up, of each tier's share of the part of ``amount`` that falls in it (tiers in order)."""
    out, left = 0.0, float(amount)
    for size, share in tiers:
        take = min(left, size)
        out += take * share
        left -= take
    return math.ceil(out)


def reserved_cpu(millis: int) -> int:
    """GKE's kubelet CPU reservation: 6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 %
    of the rest."""
    return _tiered(millis, [(1000, 0.06), (1000, 0.01), (2000, 0.005), (math.inf, 0.0025)])


def reserved_memory(nbytes: int) -> int:
    """GKE's kubelet memory reservation: 25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of
    the next 112, 2 % above 128 GiB; 255 MiB under 1 GiB; plus the 100 MiB eviction threshold."""
    if nbytes < GiB:
        return 255 * 2**20 + 100 * 2**20
    tiers = [(4 * GiB, 0.25), (4 * GiB, 0.20), (8 * GiB, 0.10), (112 * GiB, 0.06), (math.inf, 0.02)]
    return _tiered(nbytes, tiers) + 100 * 2**20


def shape_of(node: NodeType, cluster: Cluster) -> Shape:
    capacity_cpu = round(node.vcpus * 1000)
    capacity_mem = memory_bytes(node.memory)
    if node.allocatable is not None:
        cpu, mem = cpu_millis(node.allocatable.cpu), memory_bytes(node.allocatable.memory)
    else:
        cpu, mem = capacity_cpu - reserved_cpu(capacity_cpu), capacity_mem - reserved_memory(capacity_mem)
    overheads = [cluster.daemonsets] + ([cluster.gpu_daemonsets] if node.gpus else [])
    for o in overheads:
        cpu -= cpu_millis(o.cpu)
        mem -= memory_bytes(o.memory)
    return Shape(
        node.name, max(cpu, 0), max(mem, 0), node.gpus, node.max_pods, node.price_per_hour, node.vcpus, capacity_mem
    )


@dataclass
class Node:
    shape: Shape
    pods: list[PodSpec] = field(default_factory=list)
    cpu: int = 0
    memory: int = 0
    gpu: int = 0

    def fits(self, pod: PodSpec) -> bool:
        if not self.shape.holds(pod):
            return False
        if self.pods and (pod.exclusive or any(p.exclusive for p in self.pods)):
            return False
        s = self.shape
        return (
            self.cpu + pod.cpu <= s.cpu
            and self.memory + pod.memory <= s.memory
            and self.gpu + pod.gpu <= s.gpu
            and len(self.pods) < s.max_pods
        )

    def add(self, pod: PodSpec) -> None:
        self.pods.append(pod)
        self.cpu += pod.cpu
        self.memory += pod.memory
        self.gpu += pod.gpu


class NoFit(Exception):
    """A pod that no node type on offer holds."""

    def __init__(self, pod: PodSpec, shapes: Sequence[Shape]) -> None:
        self.pod = pod
        self.shapes = list(shapes)
        super().__init__(pod.label)


def _order(pod: PodSpec) -> tuple[int, int, int, int]:
    return (pod.gpu, int(pod.exclusive), pod.cpu, pod.memory)


def pack(pods: Sequence[PodSpec], nodes: list[Node], opener: Callable[[PodSpec], Shape]) -> list[Node]:
    """First-fit decreasing: each pod (largest first) onto the first node with room, else a new node of the type
    ``opener`` names. ``nodes`` (already open) are filled first and are part of the result.

    Nodes only fill up, so a node that could not take a pod never takes an identical one later: the search for
    the next identical pod starts where the last one's ended (the same answer, without rescanning full nodes)."""
    start: dict[PodSpec, int] = {}
    for pod in sorted(pods, key=_order, reverse=True):
        i = start.get(pod, 0)
        while i < len(nodes) and not nodes[i].fits(pod):
            i += 1
        if i == len(nodes):
            nodes.append(Node(opener(pod)))
        nodes[i].add(pod)
        start[pod] = i
    return nodes


def _holds_all(shape: Shape, pods: Sequence[PodSpec]) -> bool:
    trial = Node(shape)
    for pod in pods:
        if not trial.fits(pod):
            return False
        trial.add(pod)
    return True


def shrink(nodes: list[Node], shapes: Sequence[Shape]) -> list[Node]:
    """Each node as the cheapest type that still holds all its pods (the last, part-filled nodes of a packing
    often fit a smaller type)."""
    for node in nodes:
        for shape in sorted(shapes, key=lambda s: (s.price, s.name)):
            if shape.price >= node.shape.price:
                break
            if _holds_all(shape, node.pods):
                node.shape = shape
                break
    return nodes


def check_fits(pods: Sequence[PodSpec], shapes: Sequence[Shape]) -> None:
    """:class:`NoFit` for the first pod that no node type holds."""
    for pod in pods:
        if not any(s.holds(pod) for s in shapes):
            raise NoFit(pod, shapes)


def cheapest_packing(pods: Sequence[PodSpec], shapes: Sequence[Shape]) -> list[Node]:
    """The cheapest FFD packing over the choices of one GPU node type (for GPU pods) and one CPU node type (for
    CPU pods that find no room); a pod whose chosen type does not hold it opens the cheapest type that does.
    GPU pods are placed first, so CPU pods fill the GPU nodes' spare room before CPU nodes are opened; then each
    node becomes the cheapest type that holds its pods (:func:`shrink`).
    Raises :class:`NoFit` for a pod that no type holds."""
    check_fits(pods, shapes)
    gpu_pods = [p for p in pods if p.gpu]
    cpu_pods = [p for p in pods if not p.gpu]
    gpu_choices: list[Shape | None] = [s for s in shapes if s.gpu] if gpu_pods else [None]
    cpu_choices: list[Shape | None] = [s for s in shapes if not s.gpu] or [None]
    best: tuple[float, int, list[Node]] | None = None
    for g in gpu_choices:
        for c in cpu_choices:

            def opener(pod: PodSpec, g: Shape | None = g, c: Shape | None = c) -> Shape:
                choice = g if pod.gpu else c
                if choice is not None and choice.holds(pod):
                    return choice
                return min((s for s in shapes if s.holds(pod)), key=lambda s: (s.price, s.name))

            nodes = shrink(pack(cpu_pods, pack(gpu_pods, [], opener), opener), shapes)
            cost = sum(n.shape.price for n in nodes)
            if best is None or (round(cost, 6), len(nodes)) < (round(best[0], 6), best[1]):
                best = (cost, len(nodes), nodes)
    assert best is not None
    return best[2]
