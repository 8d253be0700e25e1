"""Padding-aware batching (issue 14): one command, every row in one run, a table printed and written to a file.

    .venv/bin/python -m loadtests.padding                       # everything, about 10 minutes
    .venv/bin/python -m loadtests.padding --only accel --quick  # the smoke run of tests/loadtests/test_bench_padding.py

16 closed-loop clients over HTTP with binary tensors send requests whose lengths are drawn log-uniform from 8
to 256 tokens (seeded), three ways: (a) natural lengths, plain dynamic batcher; (b) padded to 256 by the
client; (c) natural lengths, padding-aware batching. Two models: MiniLM (the services' export) and ``accel``, a
python model that costs what an accelerator does (5 ms a call + 10 us per padded token, sleeping). Then
doc_classifier (modelsvc + logicd) on short and long documents, its model config without and with the padding
keys. The ways are measured in turns, ``--rounds`` times; figures are medians over the rounds, the per-round
ratios are listed. Every answer is checked (see loadtests/padding/_models.py and _service.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness import _servers
from loadtests.loadgen._stats import ServerCounters
from loadtests.padding import _service as _padding_service
from loadtests.padding._load import Measured, closed_loop, decode_v2
from loadtests.padding._models import (
    ACCEL_PADDING,
    MINILM_PADDING,
    WAY_NAMES,
    WAYS,
    Family,
    accelerator_pools,
    medians,
    minilm_pools,
    parameters_text,
    write_accelerator,
    write_minilm,
)

CLIENTS = 16
PARTS = ("minilm", "accel", "doc_classifier")
COMPUTED = "modelsvc_batch_tokens_computed"
USEFUL = "modelsvc_batch_tokens_useful"


@dataclass(frozen=True)
class Settings:
    seconds: float = 20.0
    warmup_s: float = 3.0
    rounds: int = 3
    pool: int = 256
    seed: int = 14


@dataclass
class Row:
    """One way (or side) of one model: its windows, one per round."""

    model: str
    way: str
    label: str
    runs: list[Measured] = field(default_factory=list)
    padded_by_client: bool = False
    reads_metrics: bool = False
    server_answers: int | None = None
    """Requests the server answered for this row's model over the whole run (references excluded), to compare
    with the answers the client checked; None for a service (its model server counts windows)."""

    def median(self, get: Callable[[Measured], float]) -> float:
        return medians([get(m) for m in self.runs])

    @property
    def per_s(self) -> float:
        return self.median(lambda m: m.per_s)

    def computed_per_useful(self, m: Measured) -> float:
        """(c) and services: the server's token counters; (a), (b): what was sent (the plain batcher batches
        equal lengths only, so it computes exactly the tokens of the requests, padded or not)."""
        if self.reads_metrics:
            computed, useful = m.metrics.get(COMPUTED), m.metrics.get(USEFUL)
            return computed / useful if computed and useful else math.nan
        return m.sent_tokens / m.useful_tokens if m.useful_tokens else math.nan

    def as_dict(self) -> dict[str, Any]:
        def finite(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "model": self.model, "way": self.way, "label": self.label,
            "per_s": finite(self.per_s),
            "per_s_rounds": [m.per_s for m in self.runs],
            "p50_ms": finite(self.median(lambda m: m.p(50))),
            "p99_ms": finite(self.median(lambda m: m.p(99))),
            "avg_batch": finite(self.median(lambda m: m.avg_batch)),
            "computed_per_useful": finite(self.median(self.computed_per_useful)),
            "server_cpu_pct": finite(self.median(lambda m: m.server_cpu_pct)),
            "per_server_cpu_s": finite(self.median(per_cpu_s)),
            "client_cpu_pct": finite(self.median(lambda m: m.client_cpu_pct)),
            "answers": sum(m.checked for m in self.runs),
            "server_answers": self.server_answers,
            "wrong": sum(m.wrong for m in self.runs),
            "errors": sum(sum(m.errors.values()) for m in self.runs),
            "first_problem": next((m.first_wrong for m in self.runs if m.first_wrong), ""),
        }  # fmt: skip


def per_cpu_s(m: Measured) -> float:
    """Requests per CPU second of the server: on a shared machine, what the server's share of the cores gave."""
    return m.per_s / (m.server_cpu_pct / 100.0) if m.server_cpu_pct > 0 else math.nan


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def table(rows: Sequence[Row]) -> str:
    head = ("| model | way | req/s (median) | req/s per round | p50 ms | p99 ms | avg batch | computed/useful "
            "| server CPU % | req per server CPU s | client CPU % | answers checked | wrong or failed |")  # fmt: skip
    lines = [head, "|" + "---|" * 2 + "---:|" * 11]
    for row in rows:
        d = row.as_dict()
        rounds = ", ".join(f"{v:.1f}" for v in d["per_s_rounds"])
        cells = [
            row.model, row.label, _cell(d["per_s"], ".1f"), rounds, _cell(d["p50_ms"], ".1f"),
            _cell(d["p99_ms"], ".1f"), _cell(d["avg_batch"], ".2f"), _cell(d["computed_per_useful"], ".2f"),
            _cell(d["server_cpu_pct"], ".0f"), _cell(d["per_server_cpu_s"], ".1f"), _cell(d["client_cpu_pct"], ".0f"),
            str(d["answers"]), str(d["wrong"] + d["errors"]),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio_rounds(num: Row, den: Row, get: Callable[[Measured], float]) -> list[float]:
    return [get(a) / get(b) for a, b in zip(num.runs, den.runs, strict=False) if get(b) > 0]


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def targets(rows: Sequence[Row]) -> list[str]:
    """The issue's targets beside the measured figures (medians of per-round ratios)."""
    by = {(r.model, r.way): r for r in rows}
    out = []
    per_s: Callable[[Measured], float] = lambda m: m.per_s  # noqa: E731
    for model in ("minilm", "accel"):
        a, b, c = (by.get((model, w)) for w in WAYS)
        if a is None or b is None or c is None:
            continue
        ca, cb = _ratio_rounds(c, a, per_s), _ratio_rounds(c, b, per_s)
        spread = f"rounds (c)/(a) {', '.join(f'{v:.2f}' for v in ca)}; (c)/(b) {', '.join(f'{v:.2f}' for v in cb)}"
        ra, rb = medians(ca), medians(cb)
        out.append(f"{model}: (c)/(a) = {ra:.2f}, (c)/(b) = {rb:.2f} ({spread})")
        if model == "minilm":
            by_cpu = [medians(_ratio_rounds(c, other, per_cpu_s)) for other in (a, b)]
            out.append(f"  per server CPU second: (c)/(a) = {by_cpu[0]:.2f}, (c)/(b) = {by_cpu[1]:.2f}")
            batch = c.median(lambda m: m.avg_batch)
            fill = c.median(c.computed_per_useful)
            out += [
                f"  target (c) >= 0.95 x (a): {ra:.2f} -> {_verdict(ra >= 0.95)}",
                f"  target (c) >= 4 x (b): {rb:.2f} -> {_verdict(rb >= 4.0)}",
                f"  target (c) average batch >= 4: {batch:.2f} -> {_verdict(batch >= 4.0)}",
                f"  target (c) tokens computed / useful <= 1.25: {fill:.2f} -> {_verdict(fill <= 1.25)}",
            ]
        else:
            better = a if a.per_s >= b.per_s else b
            gain = medians(_ratio_rounds(c, better, per_s))
            p99_c, p99_best = c.median(lambda m: m.p(99)), better.median(lambda m: m.p(99))
            out += [
                f"  target (c) >= 1.5 x the better of (a), (b) (= {better.label[:3]}): {gain:.2f} -> "
                f"{_verdict(gain >= 1.5)}",
                f"  target (c) p99 <= p99 of {better.label[:3]}: {p99_c:.1f} ms vs {p99_best:.1f} ms -> "
                f"{_verdict(p99_c <= p99_best)}",
            ]
    counted = [r for r in rows if r.server_answers is not None]
    if counted:
        out.append("answers checked by the client / requests the server answered: " + ", ".join(
            f"{r.model} {r.way} {r.as_dict()['answers']}/{r.server_answers}" for r in counted))  # fmt: skip
    before, after = by.get(("doc_classifier", "before")), by.get(("doc_classifier", "after"))
    if before is not None and after is not None:
        ratios = _ratio_rounds(after, before, per_s)
        out.append(f"doc_classifier: after/before = {medians(ratios):.2f} docs/s "
                   f"(rounds {', '.join(f'{v:.2f}' for v in ratios)})")  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------------------
# running


def _measure(url: str, row: Row, payloads: Sequence[Any], model: str, settings: Settings, **kw: Any) -> None:
    print(f"  {row.model} {row.label}: {settings.warmup_s:g} s warm-up + {settings.seconds:g} s", flush=True)
    m = closed_loop(url, payloads, model=model, clients=CLIENTS, warmup_s=settings.warmup_s,
                    seconds=settings.seconds, **kw)  # fmt: skip
    row.runs.append(m)
    print(f"    {m.per_s:.1f} req/s, p50 {m.p(50):.1f} ms, p99 {m.p(99):.1f} ms, batch {m.avg_batch:.2f}, "
          f"client CPU {m.client_cpu_pct:.0f} %, {m.checked} answers checked, {m.wrong} wrong, "
          f"errors {m.errors or 0}", flush=True)  # fmt: skip


def run_family(part: str, workdir: Path, settings: Settings, kind: str = "KIND_CPU") -> list[Row]:
    repo = workdir / f"repo_{part}"
    repo.mkdir()
    family: Family = write_minilm(repo, kind) if part == "minilm" else write_accelerator(repo)
    rows = [Row(part, w, WAY_NAMES[w], padded_by_client=w == "b", reads_metrics=w == "c") for w in WAYS]
    with _servers.modelsvc_server(repo, 120.0) as server:
        assert server.proc is not None
        fill = minilm_pools if part == "minilm" else accelerator_pools
        fill(family, server.base_url, settings.pool, settings.seed)
        for r in range(settings.rounds):
            print(f"{part}: round {r + 1}/{settings.rounds}", flush=True)
            for row in rows:
                _measure(server.base_url, row, family.pools[row.way], family.model(row.way), settings,
                         server_url=server.base_url, metrics_url=_padding_service.metrics_url_of(server),
                         server_pids=[server.proc.pid], decode=decode_v2)  # fmt: skip
        for row in rows:
            stats = httpx.get(f"{server.base_url}/v2/models/{family.model(row.way)}/stats", timeout=30).json()
            answered = ServerCounters.from_stats_json(stats).counts.get("success", 0)
            row.server_answers = answered - family.references.get(row.way, 0)
    if family.worst:
        print(f"{part}: largest difference from an answer alone: "
              + ", ".join(f"({w}) {v:.1e}" for w, v in sorted(family.worst.items())))  # fmt: skip
    return rows


def run_service(workdir: Path, settings: Settings) -> tuple[list[Row], str]:
    rows = [Row("doc_classifier", side, f"{side} ({'with' if side == 'after' else 'without'} padding keys)",
                reads_metrics=True) for side in _padding_service.SIDES]  # fmt: skip
    with _padding_service.pairs(workdir) as sides:
        pools, note = _padding_service.service_pools(sides, settings.seed)
        for r in range(settings.rounds):
            print(f"doc_classifier: round {r + 1}/{settings.rounds}", flush=True)
            for row in rows:
                pair = sides[row.way]
                _measure(pair.url, row, pools[row.way], "minilm", settings, server_url=pair.model_url,
                         metrics_url=pair.metrics_url, server_pids=pair.pids,
                         decode=_padding_service.decode_json)  # fmt: skip
    return rows, note


def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.padding", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 s warm-up, 3 s windows")
    parser.add_argument("--seconds", type=float, help="window length (default 20, quick 3)")
    parser.add_argument("--rounds", type=int, help="rounds of interleaved measurements (default 3, quick 1)")
    parser.add_argument("--output", type=Path, help="the results file (markdown); a .json beside it")
    parser.add_argument(
        "--kind", choices=("KIND_CPU", "KIND_GPU"), default="KIND_CPU",
        help="where MiniLM's instance runs (KIND_GPU: ONNX Runtime's CUDA provider; loadtests/gpu/verify.sh)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    settings = Settings(seconds=3.0, warmup_s=1.0, rounds=1, pool=64) if args.quick else Settings()
    settings = Settings(args.seconds or settings.seconds, settings.warmup_s, args.rounds or settings.rounds,
                        settings.pool, settings.seed)  # fmt: skip
    output: Path = args.output or Path(tempfile.gettempdir()) / f"bench_padding-{time.strftime('%Y%m%d-%H%M%S')}.md"
    started = time.time()
    header = [
        f"command: {' '.join([Path(sys.executable).name, '-m', 'loadtests.padding', *(argv or sys.argv[1:])])}",
        f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))}; {machine()}",
        f"{CLIENTS} closed-loop clients, HTTP binary tensors, lengths log-uniform 8..256 (seed {settings.seed}, "
        f"pool {settings.pool}); {settings.rounds} round(s) of {settings.warmup_s:g} s warm-up + "
        f"{settings.seconds:g} s per row, ways in turns",
    ]
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_padding-") as tmp:
        for part in parts:
            if part == "doc_classifier":
                service_rows, note = run_service(Path(tmp), settings)
                rows += service_rows
                notes.append(f"doc_classifier: {note}")
            else:
                rows += run_family(part, Path(tmp), settings, args.kind)
    notes += [f"(c) config of minilm and doc_classifier after: {parameters_text(MINILM_PADDING).strip()}",
              f"(c) config of accel: {parameters_text(ACCEL_PADDING).strip()}"]  # fmt: skip
    text = "\n".join([
        *header, f"finished after {time.time() - started:.0f} s; load average at the end "
        f"{os.getloadavg()[0]:.2f}", "", table(rows), "", *targets(rows), "", *notes,
    ])  # fmt: skip
    print("\n" + text)
    output.write_text(text + "\n")
    output.with_suffix(".json").write_text(
        json.dumps(
            {"header": header, "rows": [r.as_dict() for r in rows], "targets": targets(rows), "notes": notes}, indent=1
        )
    )
    print(f"\nwritten to {output} and {output.with_suffix('.json')}")
    bad = sum(r.as_dict()["wrong"] + r.as_dict()["errors"] for r in rows)
    bad += sum(abs(r.server_answers - r.as_dict()["answers"]) for r in rows if r.server_answers is not None)
    if bad:
        print(f"{bad} answers were wrong or failed", file=sys.stderr)
        return 1
    return 0
