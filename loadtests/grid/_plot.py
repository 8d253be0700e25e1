"""The concurrency curve of the grid benchmark as a PNG: throughput and p99 latency against concurrency (log-x),
one line per server and model (and protocol), the command that made it in the title. matplotlib is the
``loadtests`` extra, imported only here."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.grid._report import Cell

EXTRA_HINT = "the plot needs matplotlib: pip install -e '.[loadtests]' (or pip install matplotlib)"
STYLE = {"modelsvc-python": ("tab:blue", "o"), "modelsvc-onnx": ("tab:green", "s"), "triton-python": ("tab:red", "^")}


def pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend, or None (with the message naming the extra) when not installed."""
    try:
        import matplotlib
    except ImportError:
        print(EXTRA_HINT)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curve(cells: Sequence[Cell], variants: Sequence[str], path: Path, title: str, subtitle: str) -> bool:
    """Write the two-panel PNG; False when matplotlib is missing or there is nothing to draw."""
    plt = pyplot()
    if plt is None or not cells:
        return False
    fig, (ax_thr, ax_p99) = plt.subplots(1, 2, figsize=(13, 5.2))
    concurrencies = sorted({c.concurrency for c in cells})
    protocols = list(dict.fromkeys(c.protocol for c in cells))
    drawn = 0
    for proto in protocols:
        mine = sorted((c for c in cells if c.protocol == proto), key=lambda c: c.concurrency)
        for v in variants:
            color, marker = STYLE.get(v, ("black", "x"))
            dash = "-" if proto == protocols[0] else "--"
            label = v if len(protocols) == 1 else f"{v} ({proto})"
            thr = [(c.concurrency, x) for c in mine if (x := c.infer(v)) is not None]
            p99 = [(c.concurrency, x) for c in mine if (x := c.p99(v)) is not None]
            if thr:
                ax_thr.plot(*zip(*thr, strict=True), dash, color=color, marker=marker, label=label)
                drawn += 1
            if p99:
                ax_p99.plot(*zip(*p99, strict=True), dash, color=color, marker=marker, label=label)
    if not drawn:
        plt.close(fig)
        return False
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax_p99.set_yscale("log")
    plain = FuncFormatter(lambda y, _pos: f"{y:g}")
    for ax, ylabel in ((ax_thr, "throughput (inferences/s)"), (ax_p99, "p99 latency (ms, log scale)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    ax_thr.set_ylim(bottom=0)
    ax_thr.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:,.0f}"))
    ax_p99.yaxis.set_major_formatter(plain)
    ax_p99.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    ax_p99.yaxis.set_minor_formatter(plain)
    ax_thr.set_title("throughput")
    ax_p99.set_title("p99 latency")
    fig.suptitle("\n".join([*textwrap.wrap(title, 120), subtitle]), fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
