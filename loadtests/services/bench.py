"""The real services before and after a change: `python -m loadtests.services --base REV`.

Issue 16 asks that nothing gets slower for the real model. This runs the example services doc_classifier and
embedder as production does (``python -m modelsvc serve`` + ``python -m logicd serve services/<svc>``, two
processes each) from two checkouts of this repository, side by side on one machine, and reports current / base:

base      this repository at ``--base`` (default b3a05f9, the commit before issue 16's work) in a temporary
          ``git worktree`` (removed at the end), or the checkout given with ``--base-dir``; the built models and
          tokenizers (git-ignored) are hard-linked into it from the current checkout
current   the working tree this command runs from, uncommitted changes included

Loads: doc_classifier gets long documents (2,000-4,000 tokens, one per request) at concurrency 4: documents/s, p50
and p99; embedder gets POST /v1/embeddings with 8 short texts per request at concurrency 8: requests/s, p50 and
p99. Clients send for ``--seconds``; every answer counts, over the time to the last one. Before measuring, a correctness
guard wants the same labels from both sides for the documents and embeddings within 1e-5. Each round measures
base doc, current doc, base embedder, current embedder, one at a time; the table gives the medians over rounds and
the median of the per-round ratios. ``--quick`` is a smoke run (3 s windows, documents of 600-1,200 tokens).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from loadtests.bench_core import machine_line
from loadtests.services import _checkouts as checkouts
from loadtests.services._load import Load, doc_load, emb_load, guard_documents, guard_embeddings
from loadtests.suite._rows import Stats, median, spread

SIDES = ("base", "current")


@dataclass
class Row:
    """One metric: the median of each side over the rounds and the median of the per-round ratios."""

    metric: str
    base: float
    current: float
    ratio: float
    rounds: list[float] = field(default_factory=list)
    note: str = ""


def rows_of(load: Load, stats: dict[str, list[Stats]]) -> list[Row]:
    """Throughput, p50 and p99 of one service (for the latencies, a ratio above 1 is slower)."""
    rows = []
    for metric, unit, attr in (("throughput", load.unit, "per_s"), ("p50", "ms", "p50_ms"), ("p99", "ms", "p99_ms")):
        base = [float(getattr(s, attr)) for s in stats["base"]]
        cur = [float(getattr(s, attr)) for s in stats["current"]]
        ratios = [c / b for b, c in zip(base, cur, strict=True)]
        note = f"c={load.concurrency}; rounds {spread(ratios)}" + ("" if metric == "throughput" else "; >1 is slower")
        rows.append(Row(f"{load.service} {metric} ({unit})", median(base) or 0.0, median(cur) or 0.0,
                        median(ratios) or 0.0, ratios, note))  # fmt: skip
    return rows


def format_table(rows: Sequence[Row]) -> str:
    lines = ["| metric | base | current | current/base | notes |", "|---|---:|---:|---:|---|"]
    for r in rows:
        digits = 2 if "/s" in r.metric else 0
        lines.append(f"| {r.metric} | {r.base:.{digits}f} | {r.current:.{digits}f} | {r.ratio:.2f} | {r.note} |")
    return "\n".join(lines)


def run(base: checkouts.Checkout, args: argparse.Namespace) -> dict[str, Any]:
    """Start both checkouts' pairs, guard, measure in interleaved rounds; returns the report (rows and all)."""
    tokens = (600, 1200) if args.quick else (2000, 4000)
    doc = doc_load(tokens)
    emb = emb_load()
    sides = {"base": base, "current": checkouts.current()}
    report: dict[str, Any] = {"sides": {}, "documents_tokens": list(tokens)}
    for label, side in sides.items():
        files = checkouts.provenance(side)
        print(f"{label}: {side.description}\n  modelsvc.__file__ = {files['modelsvc']}\n"
              f"  logicd.__file__ = {files['logicd']}", flush=True)  # fmt: skip
        report["sides"][label] = {"checkout": side.description, **files}
    with ExitStack() as stack:
        print("starting doc_classifier and embedder (modelsvc + logicd) from both checkouts", flush=True)
        began = time.monotonic()
        urls = checkouts.start_pairs(stack, list(sides.values()), [doc.service, emb.service])
        print(f"  8 servers ready in {time.monotonic() - began:.0f} s", flush=True)
        checks = 2 if args.quick else 6
        guard = [
            guard_documents(urls["base", doc.service], urls["current", doc.service], doc, checks),
            guard_embeddings(urls["base", emb.service], urls["current", emb.service], emb, checks),
        ]
        print("correctness guard: " + "; ".join(guard), flush=True)
        stats: dict[str, dict[str, list[Stats]]] = {load.service: {s: [] for s in SIDES} for load in (doc, emb)}
        for i in range(args.rounds):
            for load in (doc, emb):
                for label in SIDES:
                    got = load.measure(urls[label, load.service], args.seconds)
                    stats[load.service][label].append(got)
                    print(f"  round {i + 1}/{args.rounds} {load.service:<14} {label:<7} {got.per_s:8.2f} "
                          f"{load.unit}, p50 {got.p50_ms:.0f} ms, p99 {got.p99_ms:.0f} ms", flush=True)  # fmt: skip
    rows = rows_of(doc, stats[doc.service]) + rows_of(emb, stats[emb.service])
    report.update(
        guard=guard,
        rows=[asdict(r) for r in rows],
        stats={svc: {label: [asdict(s) for s in per] for label, per in by.items()} for svc, by in stats.items()},
        table=format_table(rows),
    )
    return report


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStacks: servers stopped, worktree removed


def main(argv: Sequence[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m loadtests.services", description=doc.splitlines()[0])
    parser.add_argument("--base", default=checkouts.DEFAULT_BASE, help="the base revision (default %(default)s)")
    parser.add_argument("--base-dir", type=Path, help="an existing checkout to use as the base (no worktree)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--seconds", type=float, help="seconds per point (default 20, --quick 3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 s windows, shorter documents")
    parser.add_argument("--json", type=Path, help="also write the report (table, per-round numbers) to this file")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 20.0
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds positive")
    if missing := checkouts.missing_built(checkouts.current().root):
        parser.error(
            f"the model of {', '.join(missing)} is not built for ONNX Runtime: run "
            "`python -m services.build --backend onnxruntime` first"
        )
    signal.signal(signal.SIGTERM, _terminate)

    command = shlex.join(["python", "-m", "loadtests.services", *(sys.argv[1:] if argv is None else argv)])
    print(machine_line())
    print(f"command: {command}", flush=True)
    started = time.monotonic()
    with ExitStack() as stack:
        if args.base_dir is not None:
            base = checkouts.given_base(args.base_dir)
        else:
            base = stack.enter_context(checkouts.base_worktree(args.base))
        report = run(base, args)
    print()
    print(report["table"])
    print(f"\nbase: {report['sides']['base']['checkout']}; current: {report['sides']['current']['checkout']}")
    print(f"{args.rounds} rounds of {args.seconds:g} s per point in {time.monotonic() - started:.0f} s")
    if args.json:
        payload = {"machine": machine_line(), "command": command, "date": time.strftime("%Y-%m-%d"), **report}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0
