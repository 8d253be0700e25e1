"""What ``logicd plan`` shows: the options side by side on the terminal, the same as JSON, and an SVG picture
of each option's nodes (boxes) with their pods (bars sized by their CPU request)."""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

from ._options import Option, Planned
from ._pack import Node
from ._schema import cpu_millis, format_cpu, format_memory

__all__ = ["as_json", "render_svg", "render_text"]


def _per_million(cost: float, rps: float) -> float | None:
    return None if rps <= 0 else cost / (rps * 3600) * 1e6


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _nodes_text(nodes: list[Node]) -> str:
    counts = Counter(n.shape.name for n in nodes)
    return " + ".join(f"{k} x {name}" for name, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _use(nodes: list[Node]) -> dict[str, float | None]:
    def share(used: int, room: int) -> float | None:
        return None if room <= 0 else used / room

    return {
        "cpu": share(sum(n.cpu for n in nodes), sum(n.shape.cpu for n in nodes)),
        "memory": share(sum(n.memory for n in nodes), sum(n.shape.memory for n in nodes)),
        "gpu": share(sum(n.gpu for n in nodes), sum(n.shape.gpu for n in nodes)),
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
        pods = Counter(p.label for p in node.pods)
        key = (node.shape.name, tuple(sorted(pods.items())))
        if key in seen:
            seen[key][0] += 1
        else:
            seen[key] = [1, node, pods]
    return [(k, n, p) for k, n, p in seen.values()]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def render_text(planned: Planned, details: bool = True) -> str:
    plan = planned.plan
    ds, gds = plan.cluster.daemonsets, plan.cluster.gpu_daemonsets
    peak, avg = planned.peak_rps, planned.average_rps
    lines = [
        f"{len(planned.services)} services, peak {peak:,.0f} req/s, average {avg:,.0f} req/s; headroom "
        f"{100 * plan.cluster.headroom:.0f}% at peak; at least {plan.cluster.min_replicas} replicas per half",
        f"prices: {plan.prices_as_of or 'as given in the plan'}",
        f"room per node: allocatable (capacity less GKE's kubelet reservation, unless the node type gives it) less "
        f"the DaemonSets' requests, cpu {_q(ds.cpu)}, memory {ds.memory} (GPU nodes: more cpu {_q(gds.cpu)}, "
        f"memory {gds.memory}); pods packed by their requests",
        "",
    ]
    rows = [
        [
            "option",
            "nodes at peak",
            "$/hour peak",
            "$/1M req peak",
            "$/hour avg",
            "$/1M req avg",
            "cpu used",
            "gpu used",
            "min headroom",
        ]
    ]
    for o in planned.options:
        if o.unavailable:
            rows.append([o.name, f"unavailable: {o.unavailable}", *["-"] * 7])
            continue
        use = _use(o.nodes_peak)
        rows.append(
            [
                o.name,
                _nodes_text(o.nodes_peak),
                _money(o.cost_peak),
                _money(_per_million(o.cost_peak, peak)),
                _money(o.cost_average),
                _money(_per_million(o.cost_average, avg)),
                _pct(use["cpu"]),
                _pct(use["gpu"]),
                _pct(_min_headroom(o)),
            ]
        )
    lines += _table(rows)
    available = [o for o in planned.options if not o.unavailable]
    if available:
        best = min(available, key=lambda o: o.cost_peak)
        lines += ["", f"cheapest at peak: {best.name} ({best.title})"]
    lines += [
        "",
        "$/hour avg: the same services sized for their average traffic, as if autoscaling had shrunk the "
        "cluster (a lower bound: scaling lags).",
    ]
    if not details:
        return "\n".join(lines) + "\n"
    for shape in planned.shapes:
        gpus = f", {shape.gpu} GPU" if shape.gpu else ""
        lines.append(
            f"node type {shape.name}: {shape.vcpus:g} vCPU, {format_memory(shape.memory_capacity)}{gpus}, "
            f"${shape.price:g}/hour; room for pods: cpu {format_cpu(shape.cpu)}, memory {_gi(shape.memory)}"
        )
    for svc in planned.services:
        for key, half in svc.halves.items():
            lines.append(f"capacity {svc.name}/{key}: {half.capacity.rps:,.1f} req/s per pod ({half.capacity.source})")
    for o in available:
        lines += ["", f"== {o.name}: {o.title}", "replicas (peak / average) and capacity per pod:"]
        for d in o.deployments:
            head = "-" if d.headroom is None else f"{100 * d.headroom:.0f}%"
            lines.append(
                f"  {d.pod.label:<32} {d.peak:>4} / {d.average:<4} x {d.capacity_rps:>8,.1f} req/s  "
                f"requests cpu {format_cpu(d.pod.cpu)}, memory {format_memory(d.pod.memory)}"
                + (f", nvidia.com/gpu {d.pod.gpu}" if d.pod.gpu else "")
                + f"; headroom at peak {head}"
            )
        lines.append("nodes at peak (same type and pods grouped):")
        for k, node, pods in _groups(o.nodes_peak):
            s = node.shape
            room = (
                f"cpu {format_cpu(node.cpu)}/{format_cpu(s.cpu)}, memory {_gi(node.memory)}/"
                + f"{_gi(s.memory)}"
                + (f", gpu {node.gpu}/{s.gpu}" if s.gpu else "")
            )
            what = ", ".join(f"{label} x{n}" for label, n in sorted(pods.items()))
            lines.append(f"  {k} x {s.name} [{room}]: {what}")
    return "\n".join(lines) + "\n"


def _node_json(node: Node) -> dict[str, Any]:
    return {
        "type": node.shape.name,
        "pods": dict(sorted(Counter(p.label for p in node.pods).items())),
        "requested": {"cpu": format_cpu(node.cpu), "memory": format_memory(node.memory), "nvidia.com/gpu": node.gpu},
        "room": {
            "cpu": format_cpu(node.shape.cpu),
            "memory": format_memory(node.shape.memory),
            "nvidia.com/gpu": node.shape.gpu,
        },
    }


def as_json(planned: Planned) -> dict[str, Any]:
    peak, avg = planned.peak_rps, planned.average_rps
    options = []
    for o in planned.options:
        entry: dict[str, Any] = {"name": o.name, "title": o.title, "unavailable": o.unavailable or None}
        if not o.unavailable:
            entry.update(
                {
                    "cost_per_hour": {"peak": round(o.cost_peak, 4), "average": round(o.cost_average, 4)},
                    "cost_per_million_requests": {
                        "peak": _per_million(o.cost_peak, peak),
                        "average": _per_million(o.cost_average, avg),
                    },
                    "nodes": {
                        "peak": dict(Counter(n.shape.name for n in o.nodes_peak)),
                        "average": dict(Counter(n.shape.name for n in o.nodes_average)),
                    },
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
                                "nvidia.com/gpu": d.pod.gpu,
                            },
                        }
                        for d in o.deployments
                    ],
                    "placement_at_peak": [_node_json(n) for n in o.nodes_peak],
                }
            )
        options.append(entry)
    return {
        "prices_as_of": planned.plan.prices_as_of,
        "peak_rps": peak,
        "average_rps": avg,
        "headroom": planned.plan.cluster.headroom,
        "capacity": {
            f"{s.name}/{k}": {"rps_per_pod": h.capacity.rps, "source": h.capacity.source}
            for s in planned.services
            for k, h in s.halves.items()
        },
        "options": options,
    }


# --- the picture ------------------------------------------------------------------------------------------

_PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
]


def render_svg(planned: Planned) -> str:
    """Per option a row of node boxes (width by vCPUs) with stacked pod bars (height by CPU request); GPU pods
    outlined in black; one colour per service."""
    colours = {s.name: _PALETTE[i % len(_PALETTE)] for i, s in enumerate(planned.services)}
    colours["shared"] = "#333333"
    scale, box_h, gap, left, wrap = 4.0, 120, 6, 10, 1400
    parts: list[str] = []
    y = 10
    width = 400
    for o in planned.options:
        title = f"{o.name}: " + (
            f"unavailable ({o.unavailable})"
            if o.unavailable
            else f"${o.cost_peak:,.2f}/hour at peak, {_nodes_text(o.nodes_peak)}"
        )
        parts.append(f'<text x="{left}" y="{y + 14}" font-size="14" font-weight="bold">{html.escape(title)}</text>')
        y += 24
        x = float(left)
        for node in o.nodes_peak:
            w = max(24.0, node.shape.vcpus * scale)
            if x + w > wrap and x > left:
                x, y = float(left), y + box_h + 20
            tip = html.escape(f"{node.shape.name}: " + ", ".join(p.label for p in node.pods))
            stroke = "#000" if node.shape.gpu else "#888"
            parts.append(
                f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{box_h}" '
                f'fill="#f7f7f7" stroke="{stroke}" stroke-width="{2 if node.shape.gpu else 1}"/>'
            )
            bottom = float(y + box_h)
            for pod in sorted(node.pods, key=lambda p: (-p.gpu, p.label)):
                h = box_h * pod.cpu / max(1, round(node.shape.vcpus * 1000))
                bottom -= h
                outline = ' stroke="#000" stroke-width="1.5"' if pod.gpu else ' stroke="#fff" stroke-width="0.5"'
                parts.append(
                    f'<rect x="{x + 2:.1f}" y="{bottom:.1f}" width="{w - 4:.1f}" height="{h:.1f}" '
                    f'fill="{colours.get(pod.service, "#999")}"{outline}><title>'
                    f"{html.escape(pod.label)}</title></rect>"
                )
            fits = w >= 5.5 * len(node.shape.name)  # the full name at 9 px, else the size part at 7 px
            name = node.shape.name if fits else node.shape.name.split(".")[-1]
            parts.append(
                f'<text x="{x + w / 2:.1f}" y="{y + box_h + 12}" font-size="{9 if fits else 7}" '
                f'text-anchor="middle">{html.escape(name)}</text></g>'
            )
            x += w + gap
        width = max(width, int(x) + left)
        y += box_h + 30
    legend_x = left
    for name, colour in colours.items():
        parts.append(
            f'<rect x="{legend_x}" y="{y}" width="12" height="12" fill="{colour}"/>'
            f'<text x="{legend_x + 16}" y="{y + 11}" font-size="11">{html.escape(name)}</text>'
        )
        legend_x += 30 + 7 * len(name)
    y += 20
    parts.append(
        f'<text x="{left}" y="{y + 10}" font-size="10">Boxes: nodes at peak (width by vCPUs, GPU nodes '
        "outlined black); bars: pods, height by CPU request; GPU pods outlined.</text>"
    )
    width = max(width, legend_x + left)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 20}" font-family="sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n"
    )
