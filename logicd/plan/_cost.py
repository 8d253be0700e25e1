"""What a packed option costs per service, and how far its packing is from the best any packing could do.

- Per service: each node's price is shared among the pods on it by their dominant share (the largest of the
  shares of the node's room that a pod requests: cpu, memory, each accelerator), the node's idle room included;
  a service's $/hour is the sum over its pods, and its $/1M requests is over its own requests alone (a router's
  fan-out is not counted twice). The services' $/hour add up to the option's. A shared model service's pods
  are split among the services by the replicas each would need alone times its model's CPU request.
- Lower bound: the linear relaxation of the packing: fractional nodes of any usable type whose room covers the
  pods' total requests of every resource (cpu, memory, each accelerator) at least cost. No packing costs less;
  the gap is how much the packing costs above it (whole nodes, pods that do not tile a node, node-type limits).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from ._options import Option
from ._pack import Node, Shape

__all__ = ["Bound", "lower_bound", "per_million", "per_service"]


def per_million(cost: float, rps: float) -> float | None:
    """$ per million requests of ``cost`` $/hour at ``rps`` requests/s (None without requests)."""
    return None if rps <= 0 else cost / (rps * 3600) * 1e6


def _weights(node: Node) -> dict[str, float]:
    s = node.shape
    out: dict[str, float] = {}
    for pod, n in node.pods.items():
        shares = [pod.cpu / s.cpu if s.cpu else 0.0, pod.memory / s.memory if s.memory else 0.0]
        shares += [count / s.room(name) for name, count in pod.accelerators if s.room(name)]
        out[pod.service] = out.get(pod.service, 0.0) + n * max(shares)
    return out


def per_service(nodes: list[Node], shared: dict[str, float] | None = None) -> dict[str, float]:
    """$/hour per service of a packing; a shared model service's pods (service ``shared``) are split by
    ``shared`` (service -> share), else kept as ``shared``."""
    out: dict[str, float] = {}
    for node in nodes:
        weights = _weights(node)
        total = sum(weights.values())
        price = node.shape.price * node.count
        for service, w in weights.items():
            share = w / total if total > 0 else 1 / len(weights)
            out[service] = out.get(service, 0.0) + price * share
    if shared and "shared" in out:
        pool = out.pop("shared")
        for service, share in shared.items():
            out[service] = out.get(service, 0.0) + pool * share
    return out


@dataclass(frozen=True)
class Bound:
    cost: float
    """$/hour that no packing of these pods goes below."""
    resource: str
    """The resource that sets it."""

    def gap(self, cost: float) -> float | None:
        """How much ``cost`` is above the bound, as a share of it."""
        return None if self.cost <= 0 else cost / self.cost - 1


def _solve(rows: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rows)
    m = [[*row, b] for row, b in zip(rows, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def lower_bound(option: Option, shapes: list[Shape], at: str = "peak") -> Bound:
    """The least any packing of the option's pods could cost: the linear relaxation (fractional nodes of any
    type, each resource's total requests covered), solved through its dual, max sum(y_r x demand_r) with
    sum(y_r x room_t,r) <= price_t for every node type t, at the best vertex (few resources, few types)."""
    usable = [s for s in shapes if not s.accelerators] if option.kind == "cpu-only" else shapes
    demand: dict[str, float] = {"cpu": 0.0, "memory": 0.0}
    for d in option.deployments:
        n = d.peak if at == "peak" else d.average
        demand["cpu"] += d.pod.cpu * n
        demand["memory"] += d.pod.memory * n
        for name, count in d.pod.accelerators:
            demand[name] = demand.get(name, 0.0) + count * n
    names = [r for r, v in demand.items() if v > 0]
    if not names or not usable:
        return Bound(0.0, "")
    scale = {r: demand[r] for r in names}  # work in shares of the demand, for conditioning

    def room(s: Shape, r: str) -> float:
        raw = s.cpu if r == "cpu" else s.memory if r == "memory" else s.room(r)
        return raw / scale[r]

    constraints = [([room(s, r) for r in names], s.price) for s in usable]
    constraints += [([1.0 if j == i else 0.0 for j in range(len(names))], 0.0) for i in range(len(names))]
    best, setter = 0.0, ""
    k = len(names)
    for chosen in combinations(range(len(constraints)), k):
        y = _solve([constraints[c][0] for c in chosen], [constraints[c][1] for c in chosen])
        if y is None or any(v < -1e-12 for v in y):
            continue
        if any(sum(a * v for a, v in zip(row, y, strict=True)) > price * (1 + 1e-9) + 1e-12
               for row, price in constraints[: len(usable)]):  # fmt: skip
            continue
        value = sum(y)  # each resource's demand is 1 in these units
        if value > best:
            best = value
            setter = " + ".join(r for r, v in zip(names, y, strict=True) if v > 1e-12)
    return Bound(best, setter)
