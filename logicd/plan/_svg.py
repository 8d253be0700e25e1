"""The picture of a plan, an SVG written by hand (no plotting library): what each option costs against traffic,
with the points where the cheapest changes; each accelerated variant's cost against its throughput per pod, with
its break-even point; and each option's nodes at peak (boxes, identical nodes drawn once with their count) and
their pods (bars sized by their CPU request)."""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Sequence

from ._options import Planned
from ._render import nodes_text
from ._sensitivity import BreakEven, Sensitivity

__all__ = ["render_svg"]

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac"]  # fmt: skip
_DASH = {"cpu-only": "", "split-packed": "", "monolith-per-gpu-node": "6,3", "shared-model-service": "2,3"}


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _ticks(lo: float, hi: float) -> list[float]:
    """1-2-3-5 values within [lo, hi] on a log scale; denser where that gives fewer than three."""
    out: list[float] = []
    for steps in ((1, 2, 3, 5), (1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)):
        out = [m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
               for m in steps if lo <= m * 10.0**e <= hi]  # fmt: skip
        if len(out) >= 3:
            break
    return out


def _num(v: float, money: bool = False) -> str:
    text = f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    return f"${text}" if money else text


class _Chart:
    """A log-log chart in a box at (x, y) of w x h; series drawn as polylines."""

    def __init__(self, x: float, y: float, w: float, h: float, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.x, self.y, self.w, self.h = x, y, w, h
        self.x0, self.x1 = min(xs), max(xs)
        lo, hi = min(ys), max(ys)
        self.y0, self.y1 = lo / 1.15, hi * 1.15
        if self.x1 <= self.x0:
            self.x0, self.x1 = self.x0 / 2, self.x0 * 2
        if self.y1 <= self.y0:
            self.y0, self.y1 = self.y0 / 2, self.y0 * 2

    def px(self, v: float) -> float:
        return self.x + self.w * math.log(v / self.x0) / math.log(self.x1 / self.x0)

    def py(self, v: float) -> float:
        return self.y + self.h - self.h * math.log(v / self.y0) / math.log(self.y1 / self.y0)

    def frame(self, xlabel: str, ylabel: str, xfmt: str = "") -> list[str]:
        out = [f'<rect x="{self.x}" y="{self.y}" width="{self.w}" height="{self.h}" fill="#fcfcfc" stroke="#999"/>']
        for v in _ticks(self.y0, self.y1):
            y = self.py(v)
            out.append(f'<line x1="{self.x}" y1="{y:.1f}" x2="{self.x + self.w}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                       f'<text x="{self.x - 4}" y="{y + 3:.1f}" font-size="9" text-anchor="end">'
                       f"{_e(_num(v, True))}</text>")  # fmt: skip
        for v in _ticks(self.x0, self.x1):
            x = self.px(v)
            out.append(f'<line x1="{x:.1f}" y1="{self.y}" x2="{x:.1f}" y2="{self.y + self.h}" stroke="#e5e5e5"/>'
                       f'<text x="{x:.1f}" y="{self.y + self.h + 12}" font-size="9" text-anchor="middle">'
                       f"{_e(_num(v) + xfmt)}</text>")  # fmt: skip
        out.append(f'<text x="{self.x + self.w / 2}" y="{self.y + self.h + 26}" font-size="10" '
                   f'text-anchor="middle">{_e(xlabel)}</text>'
                   f'<text x="{self.x - 42}" y="{self.y + self.h / 2}" font-size="10" text-anchor="middle" '
                   f'transform="rotate(-90 {self.x - 42} {self.y + self.h / 2})">{_e(ylabel)}</text>')  # fmt: skip
        return out

    def line(self, points: Sequence[tuple[float, float]], colour: str, dash: str = "", width: float = 2) -> str:
        path = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in points)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{width}"{d}/>'

    def vline(self, v: float, colour: str, label: str) -> str:
        x = self.px(v)
        return (f'<line x1="{x:.1f}" y1="{self.y}" x2="{x:.1f}" y2="{self.y + self.h}" stroke="{colour}" '
                f'stroke-dasharray="4,3"/><text x="{x + 3:.1f}" y="{self.y + 11}" font-size="9" '
                f'fill="{colour}">{_e(label)}</text>')  # fmt: skip


def _traffic(sens: Sensitivity, colours: dict[str, str], top: float, left: float) -> tuple[list[str], float]:
    series = {n: [(s, c) for s, c in zip(sens.curve_scales, costs, strict=True) if c is not None and c > 0]
              for n, costs in sens.curves.items()}  # fmt: skip
    series = {n: pts for n, pts in series.items() if pts}
    if not series:
        return [], top
    chart = _Chart(left + 60, top + 26, 620, 280, sens.curve_scales, [c for pts in series.values() for _, c in pts])
    out = [f'<text x="{left}" y="{top + 14}" font-size="14" font-weight="bold">$/hour against traffic '
           "(every service's peak scaled together; lower is better)</text>"]  # fmt: skip
    out += chart.frame("traffic, multiple of the peak", "$/hour", "x")
    if chart.x0 <= sens.average_scale <= chart.x1:
        out.append(chart.vline(sens.average_scale, "#777", "average"))
    out.append(chart.vline(1.0, "#777", "peak"))
    for c in sens.crossovers:
        out.append(chart.vline(c.scale, "#c00", f"{c.scale:.2f}x: {c.above}"))
    legend_y = top + 30
    for name, pts in series.items():
        kind = name.split("@")[0]
        out.append(chart.line(pts, colours[name], _DASH.get(kind, "")))
        out.append(f'<line x1="{left + 700}" y1="{legend_y}" x2="{left + 724}" y2="{legend_y}" '
                   f'stroke="{colours[name]}" stroke-width="2" stroke-dasharray="{_DASH.get(kind, "")}"/>'
                   f'<text x="{left + 730}" y="{legend_y + 4}" font-size="10">{_e(name)}</text>')  # fmt: skip
        legend_y += 15
    return out, max(top + 26 + 280 + 40, legend_y + 10)


def _break_even(b: BreakEven, colour: str, top: float, left: float) -> list[str]:
    pts = [(x, c) for x, c in b.curve if math.isfinite(c) and c > 0]
    if not pts:
        return []
    level = [b.alternative_cost] if b.alternative_cost > 0 else []  # free nodes draw no level on a log scale
    chart = _Chart(left + 60, top + 26, 420, 200, [x for x, _ in pts], [c for _, c in pts] + level)
    title = f"{b.service}/{b.variant}: $/hour of its split against {b.unit}/s per pod"
    out = [f'<text x="{left}" y="{top + 14}" font-size="11" font-weight="bold">{_e(title)}</text>']
    out += chart.frame(f"{b.unit}/s per pod", "$/hour")
    x0, x1 = chart.x0, chart.x1
    if level:
        out.append(chart.line([(x0, b.alternative_cost), (x1, b.alternative_cost)], "#555", "5,3", 1.5))
        out.append(f'<text x="{chart.x + chart.w - 4}" y="{chart.py(b.alternative_cost) - 4:.1f}" font-size="9" '
                   f'text-anchor="end" fill="#555">{_e(b.alternative)}</text>')  # fmt: skip
    out.append(chart.line(pts, colour))
    out.append(chart.vline(b.measured, "#333", f"measured {b.measured:.3g}"))
    if b.at is not None:
        out.append(chart.vline(b.at, "#c00", f"break-even {b.at:.3g}"))
    for i, line in enumerate(textwrap.wrap(b.sentence(), 88)):
        out.append(f'<text x="{left}" y="{top + 26 + 200 + 42 + 12 * i}" font-size="10">{_e(line)}</text>')
    return out


def _nodes(planned: Planned, colours: dict[str, str], top: float, left: float) -> tuple[list[str], float, float]:
    scale, box_h, gap, wrap = 4.0, 120, 6, 1400
    parts: list[str] = []
    y, width = top, 400.0
    for o in planned.options:
        title = f"{o.name}: " + (f"unavailable ({o.unavailable})" if o.unavailable
                                 else f"${o.cost_peak:,.2f}/hour at peak, {nodes_text(o.nodes_peak)}")  # fmt: skip
        parts.append(f'<text x="{left}" y="{y + 14}" font-size="13" font-weight="bold">{_e(title[:220])}</text>')
        y += 24
        x = float(left)
        for node in o.nodes_peak[:60]:
            w = max(24.0, min(node.shape.vcpus, 192) * scale)
            if x + w > wrap and x > left:
                x, y = float(left), y + box_h + 22
            tip = _e(
                f"{node.count:,} x {node.shape.name}: " + ", ".join(f"{p.label} x{n}" for p, n in node.pods.items())
            )
            stroke = "#000" if node.shape.gpu else "#888"
            parts.append(f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{box_h}" '
                         f'fill="#f7f7f7" stroke="{stroke}" stroke-width="{2 if node.shape.gpu else 1}"/>')  # fmt: skip
            bottom = float(y + box_h)
            for pod, n in sorted(node.pods.items(), key=lambda pn: (-pn[0].gpu, pn[0].label)):
                h = box_h * pod.cpu * n / max(1, round(node.shape.vcpus * 1000))
                bottom -= h
                outline = ' stroke="#000" stroke-width="1.5"' if pod.gpu else ' stroke="#fff" stroke-width="0.5"'
                parts.append(f'<rect x="{x + 2:.1f}" y="{bottom:.1f}" width="{w - 4:.1f}" height="{h:.1f}" '
                             f'fill="{colours.get(pod.service, "#999")}"{outline}><title>{_e(pod.label)} x{n}'
                             "</title></rect>")  # fmt: skip
            fits = w >= 5.5 * len(node.shape.name)
            name = node.shape.name if fits else node.shape.name.split(".")[-1]
            count = f"{node.count:,} x " if node.count > 1 else ""
            parts.append(f'<text x="{x + w / 2:.1f}" y="{y + box_h + 12}" font-size="{9 if fits else 7}" '
                         f'text-anchor="middle">{_e(count + name)}</text></g>')  # fmt: skip
            x += w + gap
        if len(o.nodes_peak) > 60:
            parts.append(f'<text x="{x}" y="{y + box_h / 2}" font-size="10">... {len(o.nodes_peak) - 60} more</text>')
        width = max(width, x + left)
        y += box_h + 30
    return parts, y, width


def render_svg(planned: Planned) -> str:
    """The cost charts (when the plan has its sensitivity) above the options' nodes and pods."""
    colours = {s.name: _PALETTE[i % len(_PALETTE)] for i, s in enumerate(planned.services)}
    colours["shared"] = "#333333"
    families = {f: _PALETTE[i % len(_PALETTE)] for i, f in enumerate(planned.families or [""])}
    option_colours = {o.name: "#333333" if o.kind == "cpu-only" else families.get(o.family, "#4e79a7")
                      for o in planned.options}  # fmt: skip
    left, y, width = 10.0, 10.0, 900.0
    parts: list[str] = []
    sens = planned.sensitivity
    if isinstance(sens, Sensitivity):
        drawn, y = _traffic(sens, option_colours, y, left)
        parts += drawn
        for i, b in enumerate(sens.break_even):
            col = i % 2
            parts += _break_even(b, option_colours.get(b.option, "#000"), y, left + col * 520)
            if col == 1 or i == len(sens.break_even) - 1:
                y += 300
        width = max(width, 1060.0 if len(sens.break_even) > 1 else width)
    drawn, y, nodes_width = _nodes(planned, colours, y + 10, left)
    parts += drawn
    width = max(width, nodes_width)
    legend_x = left
    for name, colour in colours.items():
        parts.append(f'<rect x="{legend_x}" y="{y}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{legend_x + 16}" y="{y + 11}" font-size="11">{_e(name)}</text>')  # fmt: skip
        legend_x += 30 + 7 * len(name)
    y += 20
    parts.append(f'<text x="{left}" y="{y + 10}" font-size="10">Boxes: nodes at peak (width by vCPUs, accelerator '
                 "nodes outlined black; identical nodes drawn once, with their count); bars: pods, height by CPU "
                 "request; accelerated pods outlined.</text>")  # fmt: skip
    width = max(width, legend_x + left)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y + 20:.0f}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n"
    )
