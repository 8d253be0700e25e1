"""Showing results: the progress line, a perf_analyzer-like table, CSV, JSON and a PNG plot."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from loadtests.loadgen._runner import Progress, Result


class ProgressLine:
    """Writes one line per window: rewritten in place on a terminal, appended otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def __call__(self, event: Progress) -> None:
        line = (
            f"{event.load.label}: window {event.window}  {event.throughput:,.0f} req/s  "
            f"p99 {event.p99_ms:.2f} ms  errors {event.errors}{'  stable' if event.stable else ''}"
        )
        if self.tty:
            self.stream.write("\r\033[K" + line)
            if event.stable or event.window >= (event.load.windows or event.load.max_windows):
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def format_table(results: Sequence[Result]) -> str:
    """A table like perf_analyzer's summary, then its "Server:" lines for the points that have them."""
    open_loop = any(r.request_rate is not None for r in results)
    head = ["rate/s" if open_loop else "conc", "req/s", "infer/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "avg ms",
            "errors", "batch", "queue us", "compute us", "cli CPU%"]  # fmt: skip
    if open_loop:
        head += ["sent/s", "late", "dropped"]
    rows = []
    for r in results:
        s = r.server
        row = [
            _f(r.request_rate, 0) if open_loop else str(r.concurrency),
            _f(r.throughput, 1), _f(r.infer_per_s, 1),
            *(_f(r.p(p)) for p in (50, 90, 95, 99)), _f(r.latency_ms["avg"]),
            str(r.error_count),
            _f(s.avg_batch) if s else "-", _f(s.queue_us, 0) if s else "-", _f(s.compute_us, 0) if s else "-",
            _f(r.client_cpu_pct, 0),
        ]  # fmt: skip
        if open_loop:
            row += [_f(r.sent_per_s, 1), str(r.late), str(r.dropped)]
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    for r in results:
        level = f"rate {r.request_rate:g}/s" if r.request_rate is not None else f"concurrency {r.concurrency}"
        notes = []
        if r.stable is False:  # None: a fixed window count, not checked
            notes.append(f"not stable after {r.windows} windows")
        notes += r.notes
        if r.errors:
            notes.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items())))
        if r.server:
            s = r.server
            notes.append(
                f"Server: {s.requests} requests, inference count {s.inference_count}, execution count "
                f"{s.execution_count}, avg request {_f(s.request_us, 0)} us (queue {_f(s.queue_us, 0)} + compute "
                f"input {_f(s.compute_input_us, 0)} + infer {_f(s.compute_infer_us, 0)} + output "
                f"{_f(s.compute_output_us, 0)})"
            )
        lines += [f"{level}: {n}" for n in notes]
    return "\n".join(lines)


def write_csv(results: Sequence[Result], path: Path) -> None:
    rows = [r.as_row() for r in results]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def write_json(results: Sequence[Result], path: Path) -> None:
    path.write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), imported only when a plot is asked for."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install -e '.[loadtests]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: Sequence[Result], path: Path, title: str = "") -> None:
    """Latency percentiles against throughput, one point per load level, labelled with the level."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ordered = sorted(results, key=lambda r: (r.concurrency or 0, r.request_rate or 0))
    xs = [r.infer_per_s for r in ordered]
    for pct in (50, 90, 95, 99):
        ax.plot(xs, [r.p(pct) for r in ordered], marker="o", label=f"p{pct}")
    for r, x in zip(ordered, xs, strict=True):
        label = f"c={r.concurrency}" if r.request_rate is None else f"{r.request_rate:g}/s"
        ax.annotate(label, (x, r.p(99)), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title or (f"{ordered[0].model or ordered[0].url} ({ordered[0].protocol})" if ordered else ""))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
