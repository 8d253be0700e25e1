"""What ``logicd plan`` shows on the terminal and as JSON: the options side by side (overall, per service, against
traffic), the cheapest per service and overall, the break-even points, and (details) each option's replicas and
nodes. The picture is ``_svg``."""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any

from ._cost import lower_bound, per_million, per_service
from ._options import Option, Planned, average_of
from ._pack import Node
from ._quantities import cpu_millis, format_cpu, format_memory
from ._sensitivity import Sensitivity

__all__ = ["as_json", "nodes_text", "render_text"]


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def nodes_text(nodes: list[Node]) -> str:
    counts: Counter[str] = Counter()
    for n in nodes:
        counts[n.shape.name] += n.count
    return " + ".join(f"{k:,} x {name}" for name, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _use(nodes: list[Node]) -> dict[str, float | None]:
    def share(used: int, room: int) -> float | None:
        return None if room <= 0 else used / room

    return {
        "cpu": share(sum(n.cpu * n.count for n in nodes), sum(n.shape.cpu * n.count for n in nodes)),
        "memory": share(sum(n.memory * n.count for n in nodes), sum(n.shape.memory * n.count for n in nodes)),
        "gpu": share(sum(n.gpu * n.count for n in nodes), sum(n.shape.gpu * n.count for n in nodes)),
    }


def _gi(nbytes: int) -> str:
    """Memory for reading: GiB with one decimal, or the exact quantity when it is whole."""
    exact = format_memory(nbytes)
    return exact if exact.endswith("Gi") or nbytes < 2**30 else f"{nbytes / 2**30:.1f}Gi"


def _q(value: str | float) -> str:
    return format_cpu(cpu_millis(value))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _min_headroom(option: Option) -> float | None:
    values = [h for d in option.deployments if (h := d.headroom) is not None]
    return min(values) if values else None


def _groups(nodes: list[Node]) -> list[tuple[int, Node, Counter[str]]]:
    """Nodes with the same type and the same pods, once each with their count."""
    seen: dict[tuple[str, tuple[tuple[str, int], ...]], list[Any]] = {}
    for node in nodes:
        pods: Counter[str] = Counter()
        for p, n in node.pods.items():
            pods[p.label] += n
        key = (node.shape.name, tuple(sorted(pods.items())))
        if key in seen:
            seen[key][0] += node.count
        else:
            seen[key] = [node.count, node, pods]
    return [(k, n, p) for k, n, p in seen.values()]


def _table(rows: list[list[str]], left: int = 2) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append(
            "  ".join(
                c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _options_table(planned: Planned) -> list[str]:
    peak, avg = planned.peak_rps, planned.average_rps
    rows = [["option", "nodes at peak", "$/hour peak", "$/1M req peak", "$/hour avg", "$/1M req avg", "cpu used",
             "accel used", "min headroom", "bound", "gap"]]  # fmt: skip
    notes = []
    for o in planned.options:
        if o.unavailable:
            rows.append([o.name, "unavailable (below)", *["-"] * 9])
            notes += textwrap.wrap(f"{o.name} unavailable: {o.unavailable}", 118, subsequent_indent="    ")
            continue
        use = _use(o.nodes_peak)
        bound = lower_bound(o, planned.shapes)
        rows.append([o.name, nodes_text(o.nodes_peak), _money(o.cost_peak), _money(per_million(o.cost_peak, peak)),
                     _money(o.cost_average), _money(per_million(o.cost_average, avg)), _pct(use["cpu"]),
                     _pct(use["gpu"]), _pct(_min_headroom(o)), _money(bound.cost),
                     _pct(bound.gap(o.cost_peak))])  # fmt: skip
    return _table(rows) + notes


def _per_service(planned: Planned) -> list[str]:
    available = [o for o in planned.options if not o.unavailable]
    if not available:
        return []
    names = [s.name for s in planned.services]
    costs = {o.name: per_service(o.nodes_peak, o.shared) for o in available}
    shared = any("shared" in c for c in costs.values())
    columns = names + (["shared"] if shared else [])
    rps = {s.name: s.service.peak_rps for s in planned.services}
    lines = ["", "$/hour per service at peak (each node's price shared by its pods' largest share of its room):"]
    rows = [["option", *columns, "total"]]
    for o in available:
        rows.append([o.name, *(_money(costs[o.name].get(c, 0.0)) for c in columns), _money(o.cost_peak)])
    lines += _table(rows, left=1)
    lines += ["", "$/1M requests per service at peak (each over its own requests):"]
    rows = [["option", *names]]
    for o in available:
        rows.append([o.name, *(_money(per_million(costs[o.name].get(c, 0.0), rps[c])) for c in names)])
    lines += _table(rows, left=1)
    lines += ["", "cheapest per service at peak:"]
    for s in planned.services:
        best = min(available, key=lambda o: (round(costs[o.name].get(s.name, 0.0), 6), o.name))
        cost = costs[best.name].get(s.name, 0.0)
        per = per_million(cost, s.service.peak_rps)
        lines.append(f"  {s.name}: {best.name}, {_money(cost)}/hour" + (f", {_money(per)}/1M requests" if per else ""))
    return lines


def _sensitivity(sens: Sensitivity) -> list[str]:
    lines = ["", "$/hour against traffic (every service's peak scaled together; average: each at its average):"]
    rows = [["option", *sens.levels]]
    for name, row in sens.table.items():
        rows.append([name, *(_money(v) for v in row)])
    lines += _table(rows, left=1)
    for c in sens.crossovers:
        lines.append(f"  from {c.scale:.2f}x the peak traffic {c.above} is cheaper than {c.below} by more than 2 %")
    if sens.table and not sens.crossovers:
        lines.append("  the cheapest option stays the cheapest (or within 2 % of it) from the average to 10x the peak")
    if sens.break_even:
        lines += ["", "break-even against throughput per pod (at peak traffic):"]
        lines += [f"  {b.service}/{b.variant}: {b.sentence()}" for b in sens.break_even]
    return lines


def render_text(planned: Planned, details: bool = True) -> str:
    plan = planned.plan
    ds, gds = plan.cluster.daemonsets, plan.cluster.gpu_daemonsets
    peak, avg = planned.peak_rps, planned.average_rps
    who = {"gke": "GKE's", "eks": "EKS's"}[plan.cluster.kubelet_reservation]
    lines = [
        f"{len(planned.services)} services, peak {peak:,.0f} req/s, average {avg:,.0f} req/s; headroom "
        f"{100 * plan.cluster.headroom:.0f}% at peak; at least {plan.cluster.min_replicas} replicas per half",
        f"prices: {plan.prices_as_of or 'as given in the plan'}",
        f"room per node: allocatable (capacity less {who} kubelet reservation, unless the node type gives it) less "
        f"the DaemonSets' requests, cpu {_q(ds.cpu)}, memory {ds.memory} (accelerator nodes: more cpu {_q(gds.cpu)}, "
        f"memory {gds.memory}); pods packed by their requests",
        "",
    ]
    lines += _options_table(planned)
    available = [o for o in planned.options if not o.unavailable]
    if available:
        best = planned.option(planned.cheapest() or available[0].name)
        lines += ["", f"cheapest at peak: {best.name} ({best.title})"]
    lines += [
        "",
        *textwrap.wrap(
            "$/hour avg: the same services sized for their average traffic, as if autoscaling had shrunk the "
            "cluster (a lower bound: scaling lags). bound: no packing of the option's pods costs less (fractional "
            "nodes covering every resource's total requests at least cost); gap: the packing above it.",
            118,
        ),
    ]
    lines += _per_service(planned)
    if isinstance(planned.sensitivity, Sensitivity):
        lines += _sensitivity(planned.sensitivity)
    if not details:
        return "\n".join(lines) + "\n"
    lines.append("")
    for shape in planned.shapes:
        acc = "".join(f", {k} {v}" for k, v in shape.accelerators) + (f" ({shape.label})" if shape.label else "")
        lines.append(
            f"node type {shape.name}: {shape.vcpus:g} vCPU, {format_memory(shape.memory_capacity)}{acc}, "
            f"${shape.price:g}/hour; room for pods: cpu {format_cpu(shape.cpu)}, memory {_gi(shape.memory)}"
        )
    for svc in planned.services:
        for key, half in svc.halves.items():
            for r in svc.variants.values() if key == "model" else [half]:
                name = f"{svc.name}/{key}" + (f"@{r.variant}" if key == "model" and len(svc.variants) > 1 else "")
                lines.append(f"capacity {name}: {r.capacity.rps:,.4g} req/s per pod ({r.capacity.source})")
    for o in available:
        lines += ["", f"== {o.name}: {o.title}", "replicas (peak / average) and capacity per pod:"]
        for d in o.deployments:
            head = "-" if d.headroom is None else f"{100 * d.headroom:.0f}%"
            acc = "".join(f", {k} {v}" for k, v in d.pod.accelerators)
            lines.append(
                f"  {d.pod.label:<32} {d.peak:>4,} / {d.average:<4,} x {d.capacity_rps:>8,.4g} req/s  "
                f"requests cpu {format_cpu(d.pod.cpu)}, memory {format_memory(d.pod.memory)}{acc}"
                f"; headroom at peak {head}" + (f"; {d.note}" if d.note else "")
            )
        lines.append("nodes at peak (same type and pods grouped):")
        for k, node, pods in _groups(o.nodes_peak):
            s = node.shape
            acc = "".join(f", {name} {node.accelerators.get(name, 0)}/{n}" for name, n in s.accelerators)
            room = f"cpu {format_cpu(node.cpu)}/{format_cpu(s.cpu)}, memory {_gi(node.memory)}/{_gi(s.memory)}{acc}"
            what = ", ".join(f"{label} x{n}" for label, n in sorted(pods.items()))
            lines.append(f"  {k:,} x {s.name} [{room}]: {what}")
    return "\n".join(lines) + "\n"


def _node_json(count: int, node: Node, pods: Counter[str]) -> dict[str, Any]:
    s = node.shape
    return {
        "type": s.name,
        "count": count,
        "pods": dict(sorted(pods.items())),
        "requested": {"cpu": format_cpu(node.cpu), "memory": format_memory(node.memory), **node.accelerators},
        "room": {"cpu": format_cpu(s.cpu), "memory": format_memory(s.memory), **dict(s.accelerators)},
    }


def _node_counts(nodes: list[Node]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for n in nodes:
        out[n.shape.name] += n.count
    return dict(out)


def _sensitivity_json(sens: Sensitivity) -> dict[str, Any]:
    return {
        "traffic": {"levels": sens.levels, "cost_per_hour": sens.table},
        "traffic_curve": {"peak_multiples": sens.curve_scales, "cost_per_hour": sens.curves},
        "crossovers": [{"peak_multiple": c.scale, "below": c.below, "above": c.above} for c in sens.crossovers],
        "break_even": [
            {"service": b.service, "variant": b.variant, "option": b.option, "alternative": b.alternative,
             "alternative_cost_per_hour": b.alternative_cost, "measured_rps_per_pod": b.measured,
             "break_even_rps_per_pod": b.at, "cheaper_now": b.cheaper_now, "sentence": b.sentence()}
            for b in sens.break_even
        ],
    }  # fmt: skip


def as_json(planned: Planned) -> dict[str, Any]:
    peak, avg = planned.peak_rps, planned.average_rps
    rps = {s.name: s.service.peak_rps for s in planned.services}
    options = []
    for o in planned.options:
        entry: dict[str, Any] = {"name": o.name, "kind": o.kind, "family": o.family or None, "title": o.title,
                                 "unavailable": o.unavailable or None}  # fmt: skip
        if not o.unavailable:
            services = per_service(o.nodes_peak, o.shared)
            bound = lower_bound(o, planned.shapes)
            entry.update(
                {
                    "cost_per_hour": {"peak": round(o.cost_peak, 4), "average": round(o.cost_average, 4)},
                    "cost_per_million_requests": {
                        "peak": per_million(o.cost_peak, peak),
                        "average": per_million(o.cost_average, avg),
                    },
                    "per_service_at_peak": {
                        name: {
                            "cost_per_hour": round(cost, 4),
                            "cost_per_million_requests": per_million(cost, rps.get(name, 0.0)),
                        }
                        for name, cost in services.items()
                    },
                    "lower_bound_per_hour": {
                        "cost": round(bound.cost, 4),
                        "set_by": bound.resource,
                        "gap": bound.gap(o.cost_peak),
                    },
                    "nodes": {"peak": _node_counts(o.nodes_peak), "average": _node_counts(o.nodes_average)},
                    "used_share_at_peak": _use(o.nodes_peak),
                    "deployments": [
                        {
                            "service": d.pod.service,
                            "half": d.pod.half,
                            "replicas": {"peak": d.peak, "average": d.average},
                            "capacity_rps_per_pod": d.capacity_rps,
                            "headroom_at_peak": d.headroom,
                            "requests": {
                                "cpu": format_cpu(d.pod.cpu),
                                "memory": format_memory(d.pod.memory),
                                **dict(d.pod.accelerators),
                            },
                            "note": d.note or None,
                        }
                        for d in o.deployments
                    ],
                    "placement_at_peak": [_node_json(k, n, p) for k, n, p in _groups(o.nodes_peak)],
                }
            )
        options.append(entry)
    return {
        "prices_as_of": planned.plan.prices_as_of,
        "peak_rps": peak,
        "average_rps": avg,
        "per_service_rps": {
            s.name: {"peak": s.service.peak_rps, "average": average_of(s.service)} for s in planned.services
        },
        "headroom": planned.plan.cluster.headroom,
        "families": planned.families,
        "capacity": {
            f"{s.name}/{k}" + (f"@{r.variant}" if k == "model" and len(s.variants) > 1 else ""): {
                "rps_per_pod": r.capacity.rps,
                "source": r.capacity.source,
            }
            for s in planned.services
            for k, h in s.halves.items()
            for r in (s.variants.values() if k == "model" else [h])
        },
        "options": options,
        "sensitivity": _sensitivity_json(planned.sensitivity) if isinstance(planned.sensitivity, Sensitivity) else None,
    }
