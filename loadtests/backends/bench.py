"""MiniLM per backend and precision, in-process and served, in one command: `python -m loadtests.backends`.

The benchmark of issues 15 and 31. Each variant (onnxruntime fp32, the baseline, and int8; openvino fp32, bf16 and
int8, int8 calibrated on the doc_classifier's text as services.build builds it, and the older uncalibrated int8 of
each; pytorch fp32 and bf16) is built once into a model repository of its own, with its parity shown: the smallest
cosine of its sentence embeddings with sentence-transformers' fp32 PyTorch vectors, and whether the doc_classifier
served on it labels the long documents as it does on the baseline. Then, in interleaved rounds (every variant and
cell once per round, the order of the variants turned each round; the median of the rounds is reported):

in-process  the variant's runtime called directly (ONNX Runtime session, OpenVINO compiled model, TorchScript
            module) in a process of its own, batch 1/8/32 x 128/512 tokens -> sequences/s
served      the same model served by modelsvc (one per variant), the same grid as requests of batch B from
            ``--clients`` (2) concurrent clients, one for batch 32, over HTTP with binary tensors -> sequences/s
long docs   the doc_classifier pair (modelsvc + logicd) on each variant, long documents (2000-4000 tokens, 4-8
            windows of 512) at concurrency 4 -> documents/s

Every ratio is the variant's figure over the served onnxruntime fp32 figure of the same cell in the same round
(the pair's over the onnxruntime fp32 pair's), the median over rounds. A cell is time-boxed by calls and seconds
(one 32 x 512 call takes seconds on 2 cores). A variant that cannot be built here (an extra not installed, a
precision the build refuses) gives a row that says so. ``--quick`` is a smoke run (one round, batch 1 x 128, short
windows) used by tests/loadtests/test_bench_backends.py; ``--only`` picks variants and parts; ``--json FILE``
saves it all.
Exported variants are cached (``--cache``, ``--no-cache``) while the exporter's code and the source model are the
same: an export of MiniLM takes a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtests import bench_core
from loadtests.backends._cpu import flags_line, int8_verdict
from loadtests.backends._load import Worker, served_cell
from loadtests.backends._variants import (
    BASELINE,
    GRID_MAX_BATCH,
    VARIANTS,
    Built,
    Unavailable,
    build_variant,
    default_variant,
    min_cosine,
    reference_batch,
)
from loadtests.harness import _servers
from loadtests.harness._documents import long_documents
from loadtests.suite._pair import classify
from loadtests.suite._rows import Stats, json_load, median

PARTS = ("inprocess", "served", "pair")
DOC_CLASSIFIER = _servers.ROOT / "services" / "doc_classifier"
PARITY_COSINE = 0.999
TARGET = 3.0
"""Issue 15: the served default at least 3x today's served fp32 ONNX Runtime on the long-document benchmark."""


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    grid: tuple[tuple[int, int], ...] = ((1, 128), (8, 128), (32, 128), (1, 512), (8, 512), (32, 512))
    """(batch, tokens) cells."""
    cell_s: float = 0.8
    """Seconds per cell (at least one call; a call that takes longer ends the cell)."""
    cell_calls: int = 50
    max_call_s: float = 5.0
    """A cell whose one call would take longer (predicted from the smaller batch of the same length) is skipped."""
    clients: int = 2
    """Concurrent clients of a served cell, each sending one request of batch B at a time (one for batch 32, which
    fills max_batch_size alone)."""
    pair_concurrency: int = 4
    pair_seconds: float = 5.0
    pair_tokens: tuple[int, int] = (2000, 4000)
    pair_min_ratio: float = 0.25
    """A variant below this ratio to the baseline on the first round's longest cells skips the long documents."""

    @classmethod
    def quick(cls) -> Settings:
        return cls(rounds=1, grid=((1, 128),), cell_s=0.3, cell_calls=20, pair_concurrency=2, pair_seconds=3.0,
                   pair_tokens=(300, 600))  # fmt: skip


@dataclass
class Result:
    """Everything one variant got."""

    variant: str
    built: bool
    why: str = ""
    runs_as: str = ""
    build_s: float = 0.0
    build_notes: list[str] = field(default_factory=list)
    worker: dict[str, Any] = field(default_factory=dict)
    """What the in-process worker runs (runtime and version, providers, OpenVINO's precision, torch's threads)."""
    cosine: float | None = None
    labels: str = ""
    labels_agree: int | None = None
    labels_total: int = 0
    inprocess: dict[str, list[float]] = field(default_factory=dict)
    """"BxS" -> sequences/s per round."""
    served: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """"BxS" -> why it was not measured (a call would take too long)."""
    pair: list[Stats] = field(default_factory=list)
    pair_skipped: str = ""
    ratios: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """"inprocess"/"served" -> "BxS" -> per-round ratio to the served baseline; "pair" -> {"c=N": [...]}"""
    error: str = ""


def cell_key(batch: int, tokens: int) -> str:
    return f"{batch}x{tokens}"


# ---------------------------------------------------------------------------------------------------------
# the run


class Run:
    def __init__(
        self, settings: Settings, variants: Sequence[str], parts: Sequence[str], workdir: Path, cache: Path | None
    ):
        self.settings = settings
        self.cache = cache
        self.parts = parts
        self.workdir = workdir
        self.results = {v.key: Result(v.key, built=False) for v in VARIANTS if v.key in variants}
        self.built: dict[str, Built] = {}
        self.workers: dict[str, Worker] = {}
        self.models: dict[str, _servers.ServerProcess] = {}
        self.pairs: dict[str, str] = {}

    def say(self, line: str) -> None:
        print(line, flush=True)

    def build(self) -> None:
        for key, result in self.results.items():
            variant = next(v for v in VARIANTS if v.key == key)
            self.say(f"building {key} ...")
            try:
                built = build_variant(variant, self.workdir, self.say, self.cache)
            except Unavailable as exc:
                result.why = str(exc)
                self.say(f"  {key}: {exc}")
                continue
            self.built[key] = built
            result.built = True
            result.build_s = built.build_s
            result.runs_as = ", ".join(built.notes)
            result.build_notes = built.build_notes

    def start(self, stack: ExitStack) -> None:
        for key, built in list(self.built.items()):
            try:
                worker = Worker(built)  # the in-process rows and the parity check
                stack.callback(worker.close)
                self.workers[key] = worker
                self.results[key].worker = worker.info
                if precision := worker.info.get("inference_precision"):
                    self.results[key].runs_as += f" (OpenVINO runs {precision})"
                if "served" in self.parts or "pair" in self.parts:
                    self.say(f"starting modelsvc for {key}")
                    model = stack.enter_context(_servers.modelsvc_server(built.repo, ready_timeout_s=180))
                    self.models[key] = model
                if "pair" in self.parts:
                    logic = stack.enter_context(_servers.logicd_server(DOC_CLASSIFIER, model.base_url, 180))
                    self.pairs[key] = logic.base_url
            except Exception as exc:
                traceback.print_exc()
                self.fail(key, f"start: {exc}")

    def fail(self, key: str, what: str) -> None:
        self.results[key].error = str(what).strip().splitlines()[0][:300]
        self.built.pop(key, None)
        self.workers.pop(key, None)
        self.models.pop(key, None)
        self.pairs.pop(key, None)

    def cosines(self) -> None:
        """Each variant's sentence embeddings of the embedder's reference texts against sentence-transformers'."""
        inputs, reference = reference_batch()
        for key, worker in list(self.workers.items()):
            try:
                self.results[key].cosine = min_cosine(worker.embed(inputs), reference)
            except Exception as exc:
                self.fail(key, f"parity: {exc}")

    def labels(self, documents: list[str]) -> None:
        """The doc_classifier's labels for ``documents`` on each variant's pair against the baseline's; a variant
        that skips the long documents (too slow) is not asked (its 6 documents would outlast the model timeout)."""
        labels = {}
        for key, base in list(self.pairs.items()):
            if self.results[key].pair_skipped:
                self.results[key].labels = "not asked (too slow)"
                continue
            try:
                labels[key] = [r["label"] for r in classify(base, documents)]
            except Exception as exc:  # too slow for the logic server's model timeout, most likely: no labels, no pair
                reason = str(exc).strip().splitlines()[0][:120]
                self.results[key].labels = f"failed: {reason}"
                self.results[key].pair_skipped = "skipped: classify failed"
                self.say(f"  {key}: classify failed: {reason}")
        expected = labels.get(BASELINE.key)
        for key, got in labels.items():
            if expected is None:
                self.results[key].labels = "baseline missing"
                continue
            agree = sum(a == b for a, b in zip(got, expected, strict=True))
            self.results[key].labels_agree = agree
            self.results[key].labels = f"{agree}/{len(expected)}"
            self.results[key].labels_total = len(expected)

    def order(self, round_index: int) -> list[str]:
        keys = list(self.built)
        turn = round_index % len(keys) if keys else 0
        return keys[turn:] + keys[:turn]

    def measure_round(self, i: int, documents: list[str], pair_bodies: list[bytes]) -> None:
        """Round ``i``: every grid cell on every variant, then the long documents on every pair; the first round
        also decides which cells and pairs are too slow to measure, and checks the labels (on ``documents``)."""
        s = self.settings
        per_call: dict[tuple[str, int], tuple[int, float]] = {}
        """(variant, tokens) -> (batch, seconds per call) of the largest batch measured so far this round"""
        for batch, tokens in s.grid:
            cell = cell_key(batch, tokens)
            self.say(f"round {i + 1}/{s.rounds}: {cell}")
            for key in self.order(i):
                result = self.results[key]
                if key not in self.workers:
                    continue
                warm = 0 if i else (2 if self.built[key].runtime == "pytorch" else 1)
                if cell in result.skipped:  # decided in the first round, so every round has the same cells
                    continue
                if i == 0 and (known := per_call.get((key, tokens))) and known[1] * batch / known[0] > s.max_call_s:
                    predicted = known[1] * batch / known[0]
                    result.skipped[cell] = f"~{predicted:.0f} s/call"
                    self.say(f"  {key}: {cell} skipped, one call would take about {predicted:.0f} s")
                    continue
                try:
                    if "inprocess" in self.parts:
                        got = self.workers[key].cell(batch, tokens, s.cell_calls, s.cell_s, warm)
                        result.inprocess.setdefault(cell, []).append(got.seq_per_s)
                        per_call[key, tokens] = (batch, got.seconds / got.calls)
                    if "served" in self.parts and key in self.models:
                        clients = max(1, min(s.clients, GRID_MAX_BATCH // batch))  # batch 32 fills a batch alone
                        got = served_cell(self.models[key].base_url, batch, tokens, clients, s.cell_calls, s.cell_s,
                                          warm)  # fmt: skip
                        result.served.setdefault(cell, []).append(got.seq_per_s)
                        seconds = max(per_call.get((key, tokens), (batch, 0.0))[1], got.seconds / got.calls)
                        per_call[key, tokens] = (batch, seconds)
                except Exception as exc:
                    traceback.print_exc()
                    self.fail(key, f"{cell}: {exc}")
        if "pair" in self.parts:
            if i == 0:
                self.skip_slow_pairs()
                self.labels(documents)
            for key in self.order(i):
                if key not in self.pairs or self.results[key].pair_skipped:
                    continue
                self.say(f"round {i + 1}/{s.rounds}: long documents on {key}")
                url = f"{self.pairs[key]}/v1/classify"
                stats = json_load(url, pair_bodies, s.pair_concurrency, s.pair_seconds, until_last=True, timeout=600.0)
                if stats.errors:  # e.g. 504s: a document outlasted the logic server's model timeout
                    self.results[key].pair_skipped = f"{stats.errors} requests failed (round {i + 1})"
                    self.results[key].pair.clear()
                    self.say(f"  {key}: {self.results[key].pair_skipped}")
                    continue
                self.results[key].pair.append(stats)

    def skip_slow_pairs(self) -> None:
        """A variant far slower than the baseline on the first round's longest cells skips the long documents (its
        documents would take minutes); its grid figures already say how far it got."""
        base = self.results.get(BASELINE.key)
        if base is None:
            return
        longest = f"x{max(t for _, t in self.settings.grid)}"
        for key, result in self.results.items():
            figures = result.served or result.inprocess
            theirs = base.served or base.inprocess
            ratios = [v[0] / theirs[c][0] for c, v in figures.items() if c.endswith(longest) and v and theirs.get(c)]
            if not ratios or key == BASELINE.key:
                continue
            ratio = median(ratios) or 0.0
            if ratio < self.settings.pair_min_ratio:
                result.pair_skipped = f"skipped: {ratio:.2f}x the baseline on the longest grid cells"
                self.say(f"  {key}: long documents {result.pair_skipped}")

    def ratios(self) -> None:
        base = self.results.get(BASELINE.key)
        if base is None:
            return
        for result in self.results.values():
            for part in ("inprocess", "served"):
                figures: dict[str, list[float]] = getattr(result, part)
                out = result.ratios.setdefault(part, {})
                for cell, values in figures.items():
                    ref = base.served.get(cell, [])
                    if len(ref) == len(values):
                        out[cell] = [v / r for v, r in zip(values, ref, strict=True)]
            if result.pair and len(base.pair) == len(result.pair):
                result.ratios["pair"] = {
                    f"c={self.settings.pair_concurrency}": [
                        a.per_s / b.per_s for a, b in zip(result.pair, base.pair, strict=True)
                    ]
                }


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "modelsvc-bench_backends"


def run(settings: Settings, variants: Sequence[str], parts: Sequence[str], cache: Path | None) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench_backends-") as tmp, ExitStack() as stack:
        bench = Run(settings, variants, parts, Path(tmp), cache)
        bench.build()
        bench.start(stack)
        docs = [text for _, text in long_documents(24, *settings.pair_tokens, seed=8)]
        bench.cosines()
        bodies = [json.dumps({"documents": [text]}).encode() for text in docs]
        for i in range(settings.rounds):
            bench.measure_round(i, docs[:6], bodies)
        bench.ratios()
        return list(bench.results.values())


# ---------------------------------------------------------------------------------------------------------
# the tables


def _fmt(values: list[float], ratios: list[float] | None, skipped: str | None = None) -> str:
    figure = median(values)
    if figure is None:
        return f"skipped ({skipped})" if skipped else "-"
    ratio = median(ratios or [])
    return f"{figure:.1f}" + ("" if ratio is None else f" ({ratio:.2f}x)")


def grid_table(results: Sequence[Result], settings: Settings) -> str:
    cells = [cell_key(b, t) for b, t in settings.grid]
    lines = ["| variant | where | " + " | ".join(cells) + " |", "|---|---|" + "---:|" * len(cells)]
    for r in results:
        if not r.built or not (r.inprocess or r.served):
            lines.append(f"| {r.variant} | - | " + " | ".join(["-"] * len(cells)) + " |")
            continue
        for part, label in (("inprocess", "in-process"), ("served", "served")):
            figures: dict[str, list[float]] = getattr(r, part)
            if not figures:
                continue
            row = [_fmt(figures.get(c, []), r.ratios.get(part, {}).get(c), r.skipped.get(c)) for c in cells]
            lines.append(f"| {r.variant} | {label} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def variants_table(results: Sequence[Result], settings: Settings) -> str:
    head = ("variant", "runs as", "build s", "min cosine vs fp32 PyTorch", "labels as baseline",
            f"long docs/s (c={settings.pair_concurrency})", "p50 ms", "ratio", "rounds")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if not r.built or r.error:
            why = r.why or f"FAILED: {r.error}"
            lines.append(f"| {r.variant} | {why} | - | - | - | - | - | - | - |")
            continue
        ratios = next(iter(r.ratios.get("pair", {}).values()), [])
        ratio = median(ratios)
        docs = median([s.per_s for s in r.pair])
        p50 = median([s.p50_ms for s in r.pair])
        cells = (
            r.variant, r.runs_as, f"{r.build_s:.0f}", "-" if r.cosine is None else f"{r.cosine:.5f}",
            r.labels or "-", r.pair_skipped or ("-" if docs is None else f"{docs:.2f}"),
            "-" if p50 is None else f"{p50:.0f}",
            "-" if ratio is None else f"{ratio:.2f}", ", ".join(f"{x:.2f}" for x in ratios) or "-",
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(results: Sequence[Result], default: str) -> str:
    """What the long-document ratios say against the 3x target: the served default's (``default``, what
    ``python -m services.build`` builds on this machine), the best at parity, the fastest without it."""
    scored = []
    for r in results:
        ratio = median(next(iter(r.ratios.get("pair", {}).values()), []))
        if ratio is not None:
            scored.append((ratio, r))
    by_name = {r.variant: (ratio, r) for ratio, r in scored}
    parts = []
    if default in by_name:
        ratio, _ = by_name[default]
        met = "met" if ratio >= TARGET else "not met"
        parts.append(f"target {TARGET:.0f}x on long documents: {met}, "
                     f"the served default here ({default}) at {ratio:.2f}x")  # fmt: skip
    else:
        parts.append(f"target {TARGET:.0f}x on long documents: the served default here ({default}) was not measured")
    others = [(ratio, r) for ratio, r in scored if r.variant not in (default, BASELINE.key)]
    kept = [(ratio, r) for ratio, r in others if at_parity(r)]
    if kept:
        ratio, best = max(kept, key=lambda p: p[0])
        parts.append(f"best other at parity {best.variant} at {ratio:.2f}x")
    elif others:
        parts.append("no other variant kept parity")
    if others:
        ratio, fastest = max(others, key=lambda p: p[0])
        if not at_parity(fastest):
            cosine = "-" if fastest.cosine is None else f"{fastest.cosine:.5f}"
            parts.append(f"fastest {fastest.variant} at {ratio:.2f}x without parity (min cosine {cosine}, "
                         f"labels {fastest.labels or '-'})")  # fmt: skip
    return "; ".join(parts)


def at_parity(r: Result) -> bool:
    """Issue 15's parity: cosine >= 0.999 with sentence-transformers, the doc_classifier's labels unchanged."""
    cosine_ok = r.cosine is not None and r.cosine >= PARITY_COSINE
    return cosine_ok and r.labels_total > 0 and r.labels_agree == r.labels_total


# ---------------------------------------------------------------------------------------------------------
# the command


def _parse_only(text: str) -> tuple[list[str], list[str]]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    keys = [v.key for v in VARIANTS]
    unknown = [n for n in names if n not in keys and n not in PARTS]
    if unknown:
        raise ValueError(f"unknown variant or part {', '.join(unknown)}; choose from {', '.join([*keys, *PARTS])}")
    variants = [n for n in names if n in keys] or keys
    if BASELINE.key not in variants:
        variants.insert(0, BASELINE.key)  # every ratio is to it
    parts = [n for n in names if n in PARTS] or list(PARTS)
    return variants, parts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.backends", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round, batch 1 x 128, short windows")
    parser.add_argument("--only", default="", help="comma-separated variants and/or parts "
                        f"({', '.join(PARTS)}); the baseline {BASELINE.key} is always built")  # fmt: skip
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, help="seconds per grid cell (default 0.8, quick 0.3)")
    parser.add_argument("--clients", type=int, help="concurrent clients of a served cell (default 2)")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="keep exported variants here for the next run (default %(default)s)")  # fmt: skip
    parser.add_argument("--no-cache", action="store_true", help="export every variant again, keep nothing")
    parser.add_argument("--json", type=Path, help="also write every figure (and per-round values) to this file")
    parser.add_argument("--without-default", action="store_true",
                        help="measure the served default only if --only names it")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        variants, parts = _parse_only(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    settings = Settings.quick() if args.quick else Settings()
    overrides = {"rounds": args.rounds, "cell_s": args.seconds, "clients": args.clients}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v})

    command = shlex.join(["python", "-m", "loadtests.backends", *(sys.argv[1:] if argv is None else argv)])
    print(bench_core.machine_line())
    print(flags_line())
    print(f"command: {command}\n", flush=True)
    started = time.monotonic()
    default = default_variant()
    if default not in variants and not args.without_default:
        variants.append(default)
    print(f"the served default on this machine (python -m services.build --backend auto): {default}\n", flush=True)
    results = run(settings, variants, parts, None if args.no_cache else args.cache)
    for result in results:
        if result.variant == default:
            result.runs_as = f"**default**; {result.runs_as}"
    grid = grid_table(results, settings)
    table = variants_table(results, settings)
    line = verdict(results, default)
    print(f"\nsequences/s (ratio to served {BASELINE.key} of the same cell), median of {settings.rounds} rounds\n")
    print(grid)
    print(f"\nvariants, parity and the doc_classifier pair on long documents "
          f"({settings.pair_tokens[0]}-{settings.pair_tokens[1]} tokens)\n")  # fmt: skip
    print(table)
    int8_line = int8_verdict(results)
    print(f"\n{line}\n{int8_line}\n{len(results)} variants in {time.monotonic() - started:.0f} s")
    if args.json:
        payload: dict[str, Any] = {
            "machine": bench_core.machine_line(), "cpu": flags_line(), "command": command,
            "date": time.strftime("%Y-%m-%d"), "settings": asdict(settings), "verdict": line, "int8": int8_line,
            "results": [asdict(r) for r in results],
        }  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2))
    failed = [r for r in results if r.error]
    return 1 if failed else 0
