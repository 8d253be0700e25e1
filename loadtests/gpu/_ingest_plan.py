"""bench_ingest's pure part: the cells, the plan that fits them in the budget, the table and the issue's ratios
(tested on any machine in tests/loadtests/test_gpu_bench_ingest.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("encoder", "identity")
WORKERS = (0, 1, 4, 8, 15)
CONCURRENCY = (1, 4, 16, 64, 128, 256)
REF_ROWS = 64
REF_CONCURRENCY = (4, 16)
WINDOWS_MS = (2000, 1500, 1000, 750, 500)
TRIALS = 3
CELL_OVERHEAD_S = 1.0  # perf_analyzer's start, its connections and model metadata, the server's CPU sampled
#: the issue's targets
ONE_ROW_SHARE = 0.80
RATIO_WORKERS = 8
VS_TRITON = 2.0
VS_ONE_PROCESS = 4.0
TRITON = "triton"


@dataclass
class Cell:
    """One measured point: ``server`` "modelsvc" (with ``workers``) or "triton"; seq/s = perf_analyzer's
    inferences/s (rows, so ``rows`` x requests/s)."""

    server: str
    kind: str
    workers: int | None
    concurrency: int
    rows: int = 1
    seq_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    server_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    seconds: float = 0.0
    error: str = ""

    @property
    def label(self) -> str:
        return "triton 2.51 (python backend)" if self.server == TRITON else f"modelsvc --workers {self.workers}"


@dataclass
class Plan:
    window_ms: int
    concurrencies: list[int]
    estimate_s: float
    dropped: list[int] = field(default_factory=list)


# --- the plan (pure) -------------------------------------------------------------------------------------------


def cell_seconds(window_ms: int) -> float:
    """Expected time of one cell: 3 windows and perf_analyzer's own start."""
    return TRIALS * window_ms / 1000.0 + CELL_OVERHEAD_S


def keep_order(concurrencies: Sequence[int]) -> list[int]:
    """The order in which concurrencies are kept when the budget is short: the largest, the smallest, then each
    time the one farthest (on a log scale) from those kept, the larger on a tie."""
    rest = sorted(set(concurrencies), reverse=True)
    if len(rest) <= 2:
        return rest
    kept = [rest.pop(0), rest.pop()]
    while rest:
        best = max(rest, key=lambda c: (round(min(abs(math.log(c / k)) for k in kept), 9), c))
        rest.remove(best)
        kept.append(best)
    return kept


def plan_grid(seconds: float, series: int, concurrencies: Sequence[int], fixed: int,
              windows_ms: Sequence[int] = WINDOWS_MS) -> Plan:  # fmt: skip
    """``series`` sweeps over the concurrencies and ``fixed`` single cells in ``seconds``: the longest window with
    every concurrency, else the shortest window with as many concurrencies as fit (at least one)."""
    wanted = sorted(set(concurrencies))
    for window in sorted(windows_ms, reverse=True):
        estimate = (series * len(wanted) + fixed) * cell_seconds(window)
        if estimate <= seconds:
            return Plan(window, wanted, estimate)
    window = min(windows_ms)
    order = keep_order(wanted)
    per_cell = cell_seconds(window)
    count = max(1, min(len(order), int((seconds / per_cell - fixed) // max(series, 1))))
    kept = sorted(order[:count])
    return Plan(window, kept, (series * count + fixed) * per_cell, sorted(set(wanted) - set(kept)))


# --- the table and the ratios (pure) ---------------------------------------------------------------------------


def best(cells: Sequence[Cell], **match: object) -> Cell | None:
    """The measured cell of highest seq/s among those whose attributes equal ``match``."""
    measured = [c for c in cells if c.seq_per_s is not None and all(getattr(c, k) == v for k, v in match.items())]
    return max(measured, key=lambda c: c.seq_per_s or 0.0, default=None)


@dataclass
class Ratio:
    name: str
    value: float | None
    target: float
    detail: str

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        return "MET" if self.value >= self.target else "NOT MET"


def _where(cell: Cell) -> str:
    rows = f", {cell.rows} rows" if cell.rows != 1 else ""
    return f"{cell.seq_per_s:,.0f} seq/s ({cell.label}, c={cell.concurrency}{rows})"


def ratios(cells: Sequence[Cell]) -> list[Ratio]:
    """The issue's three figures from the cells; a missing side gives None and says which."""
    out = []
    one = [c for c in cells if c.kind == "encoder" and c.rows == 1 and c.server == "modelsvc"]
    one_best, ref = best(one), best(cells, kind="encoder", rows=REF_ROWS)
    out.append(_ratio("encoder one-row best / 64-row", one_best, ref, ONE_ROW_SHARE, "one-row", "64-row"))
    ident = best(cells, kind="identity", server="modelsvc", workers=RATIO_WORKERS)
    triton = best(cells, kind="identity", server=TRITON)
    single = best(cells, kind="identity", server="modelsvc", workers=0)
    name = f"identity --workers {RATIO_WORKERS}"
    out.append(_ratio(f"{name} / Triton python backend", ident, triton, VS_TRITON, name, "Triton"))
    out.append(_ratio(f"{name} / modelsvc one process", ident, single, VS_ONE_PROCESS, name, "--workers 0"))
    return out


def _ratio(name: str, top: Cell | None, bottom: Cell | None, target: float, top_name: str, bottom_name: str) -> Ratio:
    if top is None or bottom is None or not bottom.seq_per_s:
        missing = [n for n, c in ((top_name, top), (bottom_name, bottom)) if c is None or not c.seq_per_s]
        return Ratio(name, None, target, f"no figure for {', '.join(missing)}")
    assert top.seq_per_s is not None
    return Ratio(name, top.seq_per_s / bottom.seq_per_s, target, f"{_where(top)} / {_where(bottom)}")


def _short(error: str, width: int = 28) -> str:
    first = error.strip().splitlines()[0] if error.strip() else "failed"
    return first if len(first) <= width else first[: width - 3] + "..."


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.seq_per_s is None:
        return _short(cell.error)
    p99 = f" ({cell.p99_ms:.1f} ms)" if cell.p99_ms is not None else ""
    return f"{cell.seq_per_s:,.0f}{p99}"


def format_table(cells: Sequence[Cell], concurrencies: Sequence[int], header: Sequence[str]) -> str:
    """One row per (kind, server, rows): seq/s (p99 ms) per concurrency and the row's best; the failures in full
    below it, then the ratios."""
    rows: dict[tuple[str, str, int | None, int], dict[int, Cell]] = {}
    for c in cells:
        rows.setdefault((c.kind, c.server, c.workers, c.rows), {})[c.concurrency] = c
    concs = sorted(set(concurrencies) | {c.concurrency for c in cells})
    head = ["kind", "server", "rows", *(f"c={c}" for c in concs), "best seq/s"]
    body = []
    for (kind, _, _, nrows), by_conc in rows.items():
        top = best(list(by_conc.values()))
        label = next(iter(by_conc.values())).label
        body.append([kind, label, str(nrows), *(cell_text(by_conc.get(c)) for c in concs),
                     f"{top.seq_per_s:,.0f}" if top and top.seq_per_s else "-"])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]

    def line(items: Sequence[str]) -> str:
        cells = (s.ljust(w) if i < 2 else s.rjust(w) for i, (s, w) in enumerate(zip(items, widths, strict=True)))
        return "| " + " | ".join(cells) + " |"

    out = [*header, "", line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in body)]
    failed = [c for c in cells if c.seq_per_s is None]
    if failed:
        out += ["", "cells without a figure:"]
        out += [f"- {c.kind} {c.label} c={c.concurrency} rows={c.rows}: {c.error.strip()[:600]}" for c in failed]
    out += ["", "ratios (each side: the best over its concurrencies):"]
    for r in ratios(cells):
        value = f"{r.value:.2f}" if r.value is not None else "n/a"
        out.append(f"- {r.name} = {value} (target >= {r.target:g}): {r.verdict}; {r.detail}")
    return "\n".join(out)
