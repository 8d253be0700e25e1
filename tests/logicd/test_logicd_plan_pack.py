"""``logicd plan``'s packing in closed form (identical nodes as one group, a Deployment's pods placed together)
against first-fit decreasing written out pod by pod, here, over random pods and node types: the same nodes with
the same pods. Then what the packing is priced by: per-service costs that add up to the option's, a lower bound
that no packing beats, and counts far beyond pod-by-pod placement held in a few groups."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from logicd.plan import parse_plan, plan_all
from logicd.plan._cost import lower_bound, per_service
from logicd.plan._pack import PodSpec, Shape, cheapest_packing, expand, pack

GiB = 2**30
KINDS = ("nvidia.com/gpu", "aws.amazon.com/neuron")


def _order(pod: PodSpec) -> tuple[int, int, int, int]:
    return (sum(c for _, c in pod.accelerators), int(pod.exclusive), pod.cpu, pod.memory)


def _fits(shape: Shape, placed: list[PodSpec], pod: PodSpec) -> bool:
    """Whether one more pod fits a node of ``shape`` that holds ``placed``: written from the rules, not the code."""
    if pod.node_types is not None and shape.name not in pod.node_types:
        return False
    if shape.accelerators and not pod.accelerators and not pod.tolerates_gpu_nodes:
        return False
    if placed and (pod.exclusive or any(p.exclusive for p in placed)):
        return False
    if len(placed) + 1 > shape.max_pods:
        return False
    if sum(p.cpu for p in placed) + pod.cpu > shape.cpu or sum(p.memory for p in placed) + pod.memory > shape.memory:
        return False
    room = dict(shape.accelerators)
    for name in KINDS:
        used = sum(dict(p.accelerators).get(name, 0) for p in [*placed, pod])
        if used > room.get(name, 0):
            return False
    return True


def pod_by_pod(pods: list[tuple[PodSpec, int]], opener: Callable[[PodSpec], Shape]) -> list[tuple[str, Counter[str]]]:
    """First-fit decreasing, one pod at a time: each onto the first node it fits, else a new node."""
    nodes: list[tuple[Shape, list[PodSpec]]] = []
    for pod in sorted((p for p, n in pods for _ in range(n)), key=_order, reverse=True):
        for shape, placed in nodes:
            if _fits(shape, placed, pod):
                placed.append(pod)
                break
        else:
            nodes.append((opener(pod), [pod]))
    return [(shape.name, Counter(p.label for p in placed)) for shape, placed in nodes]


def closed_form(pods: list[tuple[PodSpec, int]], opener: Callable[[PodSpec], Shape]) -> list[tuple[str, Counter[str]]]:
    out = []
    for node in expand(pack(pods, [], opener)):
        out.append((node.shape.name, Counter({p.label: n for p, n in node.pods.items()})))
    return out


def _shape(rng: random.Random, i: int) -> Shape:
    acc = tuple(sorted({(rng.choice(KINDS), rng.randint(1, 4))})) if rng.random() < 0.4 else ()
    vcpus = rng.choice([2, 4, 8, 16])
    return Shape(f"t{i}", vcpus * 1000 - rng.randint(0, 600), vcpus * 4 * GiB, acc, rng.choice([3, 8, 110]),
                 rng.uniform(0.1, 3), vcpus, vcpus * 4 * GiB)  # fmt: skip


def _pod(rng: random.Random, i: int, shapes: list[Shape]) -> PodSpec:
    acc = ((rng.choice(KINDS), rng.randint(1, 2)),) if rng.random() < 0.3 else ()
    allowed = frozenset(rng.sample([s.name for s in shapes], min(2, len(shapes)))) if rng.random() < 0.2 else None
    return PodSpec(f"s{i}", "pod", rng.choice([0, 250, 500, 1000, 1500, 2000]), rng.choice([0, 1, 2, 3]) * GiB // 2,
                   acc, allowed, bool(acc) or rng.random() < 0.5, rng.random() < 0.1)  # fmt: skip


@pytest.mark.parametrize("seed", range(60))
def test_the_closed_form_places_every_pod_where_pod_by_pod_placement_does(seed: int) -> None:
    rng = random.Random(seed)
    shapes = [_shape(rng, i) for i in range(rng.randint(1, 4))]
    pods = [(_pod(rng, i, shapes), rng.randint(0, 40)) for i in range(rng.randint(1, 7))]
    placeable = [(p, n) for p, n in pods if any(s.holds(p) for s in shapes)]
    choice = rng.choice(shapes)

    def opener(pod: PodSpec) -> Shape:
        return choice if choice.holds(pod) else min((s for s in shapes if s.holds(pod)), key=lambda s: s.name)

    expected = pod_by_pod(placeable, opener)
    assert closed_form(placeable, opener) == expected
    assert sum(sum(c.values()) for _, c in expected) == sum(n for _, n in placeable)


def test_a_trillion_pods_take_a_few_groups() -> None:
    """10^12 pods of one kind and a few others: the groups stay few, the counts exact."""
    shapes = [Shape("big", 32000, 128 * GiB, (), 110, 1.0, 32, 128 * GiB),
              Shape("gpu", 8000, 32 * GiB, (("nvidia.com/gpu", 1),), 110, 0.75, 8, 32 * GiB)]  # fmt: skip
    pods = [(PodSpec("a", "model", 2000, 8 * GiB, (("nvidia.com/gpu", 1),), None, True), 10**12 + 7),
            (PodSpec("b", "logic", 1000, 2 * GiB, (), None, True), 3 * 10**12 + 1),
            (PodSpec("c", "pod", 3000, 1 * GiB), 5)]  # fmt: skip
    nodes = cheapest_packing(pods, shapes)
    assert len(nodes) <= 8
    placed: Counter[str] = Counter()
    for node in nodes:
        for pod, n in node.pods.items():
            placed[pod.label] += n * node.count
        assert node.cpu <= node.shape.cpu
        assert node.memory <= node.shape.memory
    assert placed == {"a/model": 10**12 + 7, "b/logic": 3 * 10**12 + 1, "c/pod": 5}
    gpu_nodes = sum(n.count for n in nodes if n.shape.name == "gpu")
    assert gpu_nodes == 10**12 + 7  # one GPU each; 6 logic pods fill each one's spare 6 CPUs
    assert placed["b/logic"] - 6 * gpu_nodes <= sum(n.count * 32 for n in nodes if n.shape.name == "big")


EXAMPLES = Path(__file__).resolve().parents[2] / "logicd" / "plan"


@pytest.mark.parametrize("name", ["example.yaml", "accelerators.yaml"])
def test_per_service_costs_add_up_and_no_packing_beats_the_bound(name: str) -> None:
    planned = plan_all(parse_plan((EXAMPLES / name).read_text()), EXAMPLES, sensitive=False)
    for o in planned.options:
        if o.unavailable:
            continue
        services = per_service(o.nodes_peak, o.shared)
        assert sum(services.values()) == pytest.approx(o.cost_peak)
        assert set(services) <= {s.name for s in planned.services}
        bound = lower_bound(o, planned.shapes)
        assert 0 < bound.cost <= o.cost_peak + 1e-9, o.name
        # the bound is the fractional packing's: each resource's total requests need that much room at least
        cpu = sum(d.pod.cpu * d.peak for d in o.deployments)
        cheapest = min(s.price / s.cpu for s in planned.shapes if s.cpu and (o.kind != "cpu-only" or not s.gpu))
        assert bound.cost >= cpu * cheapest - 1e-6


def test_an_idle_share_is_priced_by_dominant_share() -> None:
    """A GPU node with the model (its whole GPU) and two CPU pods of a quarter of its CPUs each: the model pays
    1 / (1 + 0.25 + 0.25) of the node, each CPU pod a quarter of that."""
    text = """
node_types:
  - {name: gpu8, vcpus: 8, memory: 32Gi, gpus: 1, price_per_hour: 1.5, allocatable: {cpu: 8, memory: 32Gi}}
cluster: {headroom: 0, min_replicas: 1, daemonsets: {cpu: 0, memory: 0Mi}, gpu_daemonsets: {cpu: 0, memory: 0Mi}}
services:
  - {name: m, kind: model, peak_rps: 1, latency_budget_ms: 100,
     model: {resources: {cpu: 1, memory: 1Gi, gpu: 1}, capacity: {rps: 1}}}
  - {name: c, kind: cpu, peak_rps: 2, latency_budget_ms: 100,
     pod: {resources: {cpu: 2, memory: 1Gi}, capacity: {rps: 1}}}
"""
    split = plan_all(parse_plan(text), EXAMPLES, sensitive=False).option("split-packed")
    assert split.cost_peak == 1.5
    assert per_service(split.nodes_peak) == pytest.approx({"m": 1.0, "c": 0.5})
