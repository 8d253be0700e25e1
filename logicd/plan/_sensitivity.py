"""Where each option pays: its cost against traffic (every service's peak scaled together, from the average to
10x the peak) and against one model variant's throughput per pod, with the crossover points found by bisection.

- Traffic: each option is re-sized and re-packed at every multiple of the peaks; where the cheapest option
  changes between two neighbouring multiples, bisection finds the multiple where it changes (to 1 %).
- Throughput: for every accelerated variant, its ``split-packed`` option against the cheapest option that does
  not use the variant at all (the alternative): the throughput per pod at which the two cost the same, searched
  upward (the variant beats the alternative above it) or downward (it stays cheapest down to it) from the
  measured value, over three orders of magnitude. Costs are steps (whole nodes), so the point is the lowest
  throughput at which the variant is no dearer.

Each evaluation is one closed-form packing, so a whole sweep takes a fraction of a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._options import Planned, ResolvedService, build_option, traffic_of, with_capacity
from ._pack import NoFit
from ._schema import PlanError

__all__ = ["TRAFFIC_LEVELS", "BreakEven", "Crossover", "Sensitivity", "sensitivity"]

TRAFFIC_LEVELS = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Multiples of the peak in the table, after the average."""

_CURVE_POINTS = 17

TIE = 0.02
"""Options within 2 % of each other are tied: the cheapest changes only where another is cheaper by more."""


@dataclass
class Crossover:
    scale: float
    """Multiple of the peak traffic where the cheapest option changes."""
    below: str
    above: str


@dataclass
class BreakEven:
    service: str
    variant: str
    option: str
    """The variant's split-packed option."""
    alternative: str
    """The cheapest option that does not use the variant, at the peak."""
    alternative_cost: float
    measured: float
    """Requests/s per pod measured."""
    at: float | None
    """Requests/s per pod where the variant's option costs the alternative's; None: not within the range."""
    cheaper_now: bool
    curve: list[tuple[float, float]] = field(default_factory=list)
    """(requests/s per pod, $/hour of the variant's option) for the picture."""
    unit: str = "req"

    def sentence(self) -> str:
        unit = f"{self.unit}/s per pod"
        if self.at is None:
            if self.cheaper_now:
                return (f"{self.option} stays cheapest at any throughput per pod down to "
                        f"{self.measured / 1000:.3g} {unit} (measured {self.measured:.3g})")  # fmt: skip
            return (f"{self.option} does not beat {self.alternative} (${self.alternative_cost:,.2f}/hour) even at "
                    f"1000x its measured {self.measured:.3g} {unit}: its fixed parts cost more")  # fmt: skip
        if self.cheaper_now:
            return (f"{self.option} beats {self.alternative} (${self.alternative_cost:,.2f}/hour) down to "
                    f"{self.at:.3g} {unit} (measured {self.measured:.3g})")  # fmt: skip
        return (f"{self.option} beats {self.alternative} (${self.alternative_cost:,.2f}/hour) above "
                f"{self.at:.3g} {unit} (measured {self.measured:.3g})")  # fmt: skip


@dataclass
class Sensitivity:
    levels: list[str]
    """Column names: ``average``, ``0.5x peak`` ..."""
    table: dict[str, list[float | None]]
    """$/hour per option at each level (None: unavailable there)."""
    curve_scales: list[float]
    curves: dict[str, list[float | None]]
    """$/hour per option at each of ``curve_scales`` (multiples of the peaks)."""
    average_scale: float
    crossovers: list[Crossover]
    break_even: list[BreakEven]


def _cost(planned: Planned, services: list[ResolvedService], name: str, traffic: dict[str, tuple[float, float]],
          at: str = "peak") -> float | None:  # fmt: skip
    o = planned.option(name)
    try:
        built = build_option(planned.plan, planned.shapes, services, o.kind, o.family, traffic, (at,), name)
    except (NoFit, PlanError):  # no node holds a pod, or more pods than the planner sizes: no cost there
        return None
    if built.unavailable:
        return None
    return built.cost_peak if at == "peak" else built.cost_average


def sensitivity(planned: Planned) -> Sensitivity:
    services = planned.services
    names = [o.name for o in planned.options if not o.unavailable]
    peak, avg = planned.peak_rps, planned.average_rps
    average_scale = avg / peak if peak > 0 else 1.0
    base = traffic_of(services)
    table: dict[str, list[float | None]] = {}
    for name in names:
        o = planned.option(name)
        row: list[float | None] = [o.cost_average]
        row += [o.cost_peak if s == 1.0 else _cost(planned, services, name, traffic_of(services, s))
                for s in TRAFFIC_LEVELS]  # fmt: skip
        table[name] = row
    low = max(min(average_scale, 0.5), 1e-3)
    scales = [math.exp(math.log(low) + (math.log(10.0) - math.log(low)) * i / (_CURVE_POINTS - 1))
              for i in range(_CURVE_POINTS)]  # fmt: skip
    curves = {n: [_cost(planned, services, n, traffic_of(services, s)) for s in scales] for n in names}
    crossovers: list[Crossover] = []
    if peak > 0:
        crossovers = _crossovers(planned, names, scales, curves)
    return Sensitivity(
        ["average"] + [f"{s:g}x peak" for s in TRAFFIC_LEVELS],
        table,
        scales,
        curves,
        average_scale,
        crossovers,
        _break_even(planned, base) if peak > 0 else [],
    )


def _crossovers(planned: Planned, names: list[str], scales: list[float],
                curves: dict[str, list[float | None]]) -> list[Crossover]:  # fmt: skip
    """Where the cheapest option changes along the traffic curve. The cheapest keeps its place until another is
    more than :data:`TIE` cheaper (near ties flipping back and forth are not changes); among options tied at the
    lowest traffic the one cheapest at the peak starts. Bisection finds the change to 1 %."""
    out: list[Crossover] = []
    reigning: str | None = None
    for i, scale in enumerate(scales):
        costs = {n: curves[n][i] for n in names}
        best = planned.cheapest(costs)
        if best is None:
            continue
        low = costs[best] or 0.0
        if reigning is None or costs.get(reigning) is None:
            tied = [n for n, c in costs.items() if c is not None and c <= (1 + TIE) * low]
            reigning = planned.cheapest({n: planned.option(n).cost_peak for n in tied})
            continue
        if (costs[reigning] or 0.0) <= (1 + TIE) * low:
            continue
        lo, hi = scales[i - 1], scale
        while hi / lo > 1.01:
            mid = math.sqrt(lo * hi)
            traffic = traffic_of(planned.services, mid)
            a = _cost(planned, planned.services, reigning, traffic)
            b = _cost(planned, planned.services, best, traffic)
            lo, hi = (lo, mid) if a is None or (b is not None and a > (1 + TIE) * b) else (mid, hi)
        out.append(Crossover(hi, reigning, best))
        reigning = best
    return out


def _break_even(planned: Planned, base: dict[str, tuple[float, float]]) -> list[BreakEven]:
    out = []
    available = {o.name: o for o in planned.options if not o.unavailable}
    for s in planned.services:
        for variant, r in s.variants.items():
            if not r.gpu:
                continue
            own = next((o for o in available.values() if o.kind == "split-packed" and
                        (o.family == variant or len(planned.families) <= 1)), None)  # fmt: skip
            others = {n: o.cost_peak for n, o in available.items() if o.family != variant and
                      (o.family or o.kind == "cpu-only")}  # fmt: skip
            if own is None or not others:
                continue
            alternative = planned.cheapest(others)
            assert alternative is not None
            target = others[alternative]

            def cost(rps: float, s: ResolvedService = s, variant: str = variant, name: str = own.name) -> float:
                value = _cost(planned, with_capacity(planned.services, s.name, variant, rps), name, base)
                return math.inf if value is None else value

            measured = r.capacity.rps
            cheaper = own.cost_peak <= target + 1e-9
            lo, hi = (measured / 1000, measured) if cheaper else (measured, measured * 1000)
            at: float | None = None
            if cost(lo) > target + 1e-9 and cost(hi) <= target + 1e-9:  # lo loses, hi wins: a crossing between
                while hi / lo > 1.001:
                    mid = math.sqrt(lo * hi)
                    lo, hi = (lo, mid) if cost(mid) <= target + 1e-9 else (mid, hi)
                at = hi
            span = [measured, at or measured]
            left, right = min(span) / 2, max(span) * 2
            points = [left * (right / left) ** (i / 16) for i in range(17)]
            curve = [(x, cost(x)) for x in points]
            out.append(BreakEven(s.name, variant, own.name, alternative, target, measured, at, cheaper,
                                 curve, s.service.unit))  # fmt: skip
    return out
