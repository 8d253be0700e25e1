"""Tables, summary and the JSON of the grid benchmark (loadtests/grid/bench.py): medians over rounds, ratios
modelsvc / Triton, the queue-delay rule, gRPC / HTTP, the large-tensor row and the concurrency curve."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests.grid._measure import Point
from loadtests.grid._models import LARGE_BYTES, Config

TARGET_RATIO = 1.2  # issue 16: at least 1.2x Triton's throughput in every cell
QUEUE_SLACK = 1.10  # the average queue time at most 10 % above max_queue_delay_microseconds
GRPC_TARGET = 0.8  # modelsvc's gRPC at least 0.8x its HTTP
SHORT = {"modelsvc-python": "py", "modelsvc-onnx": "onnx", "triton-python": "triton"}


@dataclass
class Cell:
    """Every round's points of one (config, concurrency, protocol), per variant."""

    config: Config
    concurrency: int
    protocol: str
    parts: set[str] = field(default_factory=set)  # grid, large, curve: a grid cell may be a point of the curve
    points: dict[str, list[Point]] = field(default_factory=dict)

    def add(self, point: Point) -> None:
        self.points.setdefault(point.variant, []).append(point)

    def _median(self, variant: str, attr: str) -> float | None:
        values = [getattr(p, attr) for p in self.points.get(variant, []) if p.ok]
        values = [v for v in values if v is not None and not math.isnan(v)]
        return statistics.median(values) if values else None

    def infer(self, variant: str) -> float | None:
        return self._median(variant, "infer_per_s")

    def p99(self, variant: str) -> float | None:
        return self._median(variant, "p99_ms")

    def batch(self, variant: str) -> float | None:
        return self._median(variant, "avg_batch")

    def queue(self, variant: str) -> float | None:
        return self._median(variant, "queue_us")

    def loopback(self, variant: str) -> float | None:
        return self._median(variant, "loopback_bytes_per_infer")

    def errors(self, variant: str) -> list[str]:
        return [p.error for p in self.points.get(variant, []) if p.error]

    def ratio(self, variant: str, base: str = "triton-python") -> float | None:
        """Median over rounds of (variant / base) measured in the same round."""
        pairs = zip(self.points.get(variant, []), self.points.get(base, []), strict=False)
        ratios = [a.infer_per_s / b.infer_per_s for a, b in pairs if a.ok and b.ok]
        return statistics.median(ratios) if ratios else None

    @property
    def queue_rule_applies(self) -> bool:
        """Delay configured and the batch cannot fill sooner (fewer clients than max_batch_size)."""
        return self.config.delay_us > 0 and self.concurrency < self.config.mbs

    def queue_breaks(self, variants: Sequence[str]) -> list[str]:
        """The modelsvc variants whose average queue is over 1.10 x delay (where the rule applies)."""
        if not self.queue_rule_applies:
            return []
        limit = QUEUE_SLACK * self.config.delay_us
        return [v for v in variants if v.startswith("modelsvc") and (q := self.queue(v)) is not None and q > limit]

    def label(self) -> str:
        return f"mbs{self.config.mbs} d{self.config.delay_us} c{self.concurrency}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "parts": sorted(self.parts),
            "max_batch_size": self.config.mbs,
            "max_queue_delay_microseconds": self.config.delay_us,
            "dims": [self.config.dim],
            "concurrency": self.concurrency,
            "protocol": self.protocol,
            "median": {
                v: {
                    "infer_per_s": self.infer(v),
                    "p99_ms": self.p99(v),
                    "avg_batch": self.batch(v),
                    "queue_us": self.queue(v),
                    "loopback_bytes_per_infer": self.loopback(v),
                }
                for v in self.points
            },
            "ratio_to_triton": {v: self.ratio(v) for v in self.points if v.startswith("modelsvc")},
            "queue_rule": None if not self.queue_rule_applies else not self.queue_breaks(list(self.points)),
            "rounds": {v: [p.as_dict() for p in pts] for v, pts in self.points.items()},
        }


def _num(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _triple(cell: Cell, variants: Sequence[str], fn: str, spec: str) -> str:
    return " / ".join(_num(getattr(cell, fn)(v), spec) for v in variants)


def _infer_or_why(cell: Cell, variant: str, triton_missing: str) -> str:
    if variant == "triton-python" and triton_missing:
        return triton_missing
    value = cell.infer(variant)
    if value is None:
        return "FAILED" if cell.errors(variant) else "-"
    return _num(value)


def queue_verdict(cell: Cell, variants: Sequence[str]) -> str:
    if not cell.queue_rule_applies:
        return "n/a"
    ratios = [f"{SHORT[v]} {q / cell.config.delay_us:.2f}" for v in variants if (q := cell.queue(v)) is not None]
    if not any(v.startswith("modelsvc") and cell.queue(v) is not None for v in variants):
        return "no data"
    verdict = "BREAKS" if cell.queue_breaks(variants) else "ok"
    return f"{verdict} (queue/delay: {', '.join(ratios)})"


def grid_table(cells: Sequence[Cell], variants: Sequence[str], triton_missing: str) -> str:
    ms = [v for v in variants if v.startswith("modelsvc")]
    short = " / ".join(SHORT[v] for v in variants)
    head = [
        "mbs",
        "delay us",
        "conc",
        "proto",
        *(f"{v} infer/s" for v in variants),
        *(f"{SHORT[v]}/triton" for v in ms),
        f"p99 ms ({short})",
        f"avg batch ({short})",
        f"avg queue us ({short})",
        "queue <= 1.1 x delay",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [
            str(c.config.mbs),
            str(c.config.delay_us),
            str(c.concurrency),
            c.protocol,
            *(_infer_or_why(c, v, triton_missing) for v in variants),
            *(_num(c.ratio(v), ".2f") for v in ms),
            _triple(c, variants, "p99", ".2f"),
            _triple(c, variants, "batch", ".1f"),
            _triple(c, variants, "queue", ",.0f"),
            queue_verdict(c, variants),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _ratios(cell: Cell, variants: Sequence[str]) -> str:
    return ", ".join(SHORT[v] + " " + _num(cell.ratio(v), ".2f") for v in variants)


def _queues(cell: Cell, variants: Sequence[str]) -> str:
    return ", ".join(f"{SHORT[v]} {_num(cell.queue(v))} us" for v in variants)


def grid_summary(cells: Sequence[Cell], variants: Sequence[str]) -> list[str]:
    """min/median ratio over the grid, the cells below 1.2x, the cells that break the queue rule."""
    out: list[str] = []
    ms = [v for v in variants if v.startswith("modelsvc")]
    for proto in dict.fromkeys(c.protocol for c in cells):
        mine = [c for c in cells if c.protocol == proto]
        for v in ms:
            ratios = [(r, c) for c in mine if (r := c.ratio(v)) is not None]
            if not ratios:
                out.append(f"{v}/triton ({proto}): no ratio (Triton not measured)")
                continue
            low = min(ratios, key=lambda rc: rc[0])
            med = statistics.median(r for r, _ in ratios)
            out.append(
                f"{v}/triton ({proto}): min {low[0]:.2f} ({low[1].label()}), median {med:.2f} over {len(ratios)} cells"
            )
        if any(c.ratio(v) is not None for c in mine for v in ms):  # else no Triton to compare with
            below = [c for c in mine if any((r := c.ratio(v)) is not None and r < TARGET_RATIO for v in ms)]
            detail = ", ".join(f"{c.label()} ({_ratios(c, ms)})" for c in below)
            out.append(
                f"cells below {TARGET_RATIO}x ({proto}): {len(below)} of {len(mine)}" + (f": {detail}" if below else "")
            )
        applies = [c for c in mine if c.queue_rule_applies]
        breaks = [c for c in applies if c.queue_breaks(ms)]
        detail = ", ".join(f"{c.label()} ({_queues(c, c.queue_breaks(ms))})" for c in breaks)
        out.append(
            f"cells breaking the queue rule ({proto}): {len(breaks)} of {len(applies)} where it applies"
            + (f": {detail}" if breaks else "")
        )
    return out


def grpc_http_table(cells: Sequence[Cell], variants: Sequence[str]) -> tuple[str, list[str]]:
    """Per cell: gRPC infer/s over HTTP infer/s of the same server and model (medians), and the cells below 0.8."""
    by_key = {(c.config, c.concurrency, c.protocol): c for c in cells}
    head = ["mbs", "delay us", "conc", *(f"{SHORT[v]} grpc/http" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    below: list[str] = []
    for c in cells:
        if c.protocol != "http" or (g := by_key.get((c.config, c.concurrency, "grpc"))) is None:
            continue
        row = [str(c.config.mbs), str(c.config.delay_us), str(c.concurrency)]
        for v in variants:
            h, r = c.infer(v), g.infer(v)
            ratio = r / h if h and r else None
            row.append(_num(ratio, ".2f"))
            if v.startswith("modelsvc") and ratio is not None and ratio < GRPC_TARGET:
                below.append(f"{c.label()} {SHORT[v]} {ratio:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    summary = [
        f"modelsvc gRPC/HTTP cells below {GRPC_TARGET}: {len(below)}" + (f": {', '.join(below)}" if below else "")
    ]
    return "\n".join(lines), summary


def large_table(cells: Sequence[Cell], variants: Sequence[str], triton_missing: str) -> str:
    head = ["variant", "proto", "conc", "infer/s", "request MB/s", "p99 ms", "avg batch", "loopback MB per infer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        for v in variants:
            infer = c.infer(v)
            mbps = infer * LARGE_BYTES / 1e6 if infer else None
            lo = c.loopback(v)
            row = [
                v,
                c.protocol,
                str(c.concurrency),
                _infer_or_why(c, v, triton_missing),
                _num(mbps, ",.0f"),
                _num(c.p99(v), ".2f"),
                _num(c.batch(v), ".1f"),
                _num(lo / 1e6 if lo else None, ".2f"),
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def curve_table(cells: Sequence[Cell], variants: Sequence[str]) -> str:
    head = ["proto", "conc", *(f"{SHORT[v]} infer/s" for v in variants), *(f"{SHORT[v]} p99 ms" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [
            c.protocol,
            str(c.concurrency),
            *(_num(c.infer(v)) for v in variants),
            *(_num(c.p99(v), ".2f") for v in variants),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def error_lines(cells: Sequence[Cell]) -> list[str]:
    out = []
    for c in cells:
        for v, pts in c.points.items():
            for p in pts:
                if p.error:
                    out.append(f"{'/'.join(sorted(c.parts))} {c.label()} {c.protocol} {v}: {p.error}")
    return out
