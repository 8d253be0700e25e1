"""Configuration sweep of one model, in the manner of Triton's Model Analyzer: ``python -m loadtests.sweep``.

For every combination of ``instance_group`` count, ``max_batch_size``, ``max_queue_delay_microseconds`` and
preferred batch sizes, the model's folder is copied into a temporary repository with its config.pbtxt rewritten
(parsed into tritonclient's ``ModelConfig`` and edited field by field), ``modelsvc serve`` starts on it on free
ports, the load generator measures each concurrency, and the server stops. The best configuration is the one
with the highest throughput at any concurrency whose p99 latency is within ``--latency-budget-ms`` and that had
no errors. Written to ``-o OUT_DIR``: ``config.pbtxt`` (the chosen configuration), ``report.md`` (every
configuration x concurrency, the chosen row marked, the plots), ``results.csv``, ``results.json`` and PNGs.

Only the swept model's folder is copied (not the rest of the repository), so ensembles are out of scope.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from loadtests import loadgen
from loadtests.harness import _servers


@dataclass(frozen=True)
class Config:
    """One point of the grid."""

    instance_count: int
    max_batch_size: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        name = f"i{self.instance_count}_mbs{self.max_batch_size}_d{self.max_queue_delay_us}"
        return name + (f"_p{'-'.join(map(str, self.preferred_batch_sizes))}" if self.preferred_batch_sizes else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.name,
            "instance_count": self.instance_count,
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_sizes": " ".join(map(str, self.preferred_batch_sizes)),
        }


def grid(
    instance_counts: Sequence[int],
    max_batch_sizes: Sequence[int],
    delays_us: Sequence[int],
    preferred: Sequence[tuple[int, ...]] = ((),),
) -> list[Config]:
    """Every combination, leaving out preferred batch sizes larger than the max batch size."""
    out = []
    for count, mbs, delay, pref in itertools.product(instance_counts, max_batch_sizes, delays_us, preferred):
        if any(p > mbs for p in pref):
            continue
        out.append(Config(count, mbs, delay, tuple(pref)))
    return out


def apply(config: model_config_pb2.ModelConfig, point: Config) -> model_config_pb2.ModelConfig:
    """A copy of ``config`` with the grid point's fields set; dynamic batching is turned on."""
    if config.max_batch_size == 0:
        raise ValueError(f"model {config.name!r} has max_batch_size 0 (no batch dimension): nothing to sweep")
    out = model_config_pb2.ModelConfig()
    out.CopyFrom(config)
    out.max_batch_size = point.max_batch_size
    if not out.instance_group:
        out.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    for group in out.instance_group:
        group.count = point.instance_count
    out.dynamic_batching.max_queue_delay_microseconds = point.max_queue_delay_us
    del out.dynamic_batching.preferred_batch_size[:]
    out.dynamic_batching.preferred_batch_size.extend(point.preferred_batch_sizes)
    return out


def read_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    path = model_dir / "config.pbtxt"
    config = model_config_pb2.ModelConfig()
    if path.exists():
        text_format.Parse(path.read_text(), config)
    if not config.name:
        config.name = model_dir.name
    return config


def write_repository(source: Path, model: str, config: model_config_pb2.ModelConfig, dest: Path) -> Path:
    """``dest`` as a repository holding only ``model``, with ``config`` as its config.pbtxt."""
    shutil.copytree(source / model, dest / model, ignore=shutil.ignore_patterns("config.pbtxt"))
    (dest / model / "config.pbtxt").write_text(text_format.MessageToString(config))
    return dest


@dataclass
class Row:
    """One configuration at one concurrency: its result, or why it has none."""

    config: Config
    concurrency: int
    result: loadgen.Result | None
    error: str = ""

    def qualifies(self, budget_ms: float) -> bool:
        r = self.result
        return r is not None and r.requests > 0 and not r.errors and r.p(99) <= budget_ms

    def as_row(self) -> dict[str, Any]:
        base: dict[str, Any] = {**self.config.as_dict(), "concurrency": self.concurrency, "error": self.error}
        if self.result is not None:
            base.update({k: v for k, v in self.result.as_row().items() if k not in ("concurrency", "model")})
        return base


def choose(rows: Sequence[Row], budget_ms: float) -> Row | None:
    """The highest throughput among the error-free rows whose p99 is within the budget (None if none is);
    a tie goes to the lower p99."""
    fits = [r for r in rows if r.qualifies(budget_ms)]
    if not fits:
        return None
    return max(fits, key=lambda r: (r.result.infer_per_s, -r.result.p(99)))  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------------
# running


def measure_config(
    repository: Path,
    model: str,
    point: Config,
    concurrencies: Sequence[int],
    load: loadgen.Load,
    inputs: loadgen.InputSpec,
    workdir: Path,
    progress: loadgen.ProgressLine | None,
) -> list[Row]:
    """Start modelsvc on the configuration, measure every concurrency, stop it."""
    try:
        config = apply(read_config(repository / model), point)
        repo = write_repository(repository, model, config, Path(tempfile.mkdtemp(prefix=f"{point.name}-", dir=workdir)))
        with _servers.modelsvc_server(repo) as server:
            target = loadgen.Target(server.base_url, model)
            loads = [loadgen.Load(**{**load.__dict__, "concurrency": c}) for c in concurrencies]
            results = loadgen.sweep(target, loads, inputs, progress)
    except (RuntimeError, ValueError, OSError, loadgen.LoadgenError) as exc:
        return [Row(point, c, None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}") for c in concurrencies]
    return [Row(point, c, r) for c, r in zip(concurrencies, results, strict=True)]


# ---------------------------------------------------------------------------------------------------------
# output


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def markdown_table(rows: Sequence[Row], chosen: Row | None, budget_ms: float) -> str:
    head = ["", "configuration", "conc", "infer/s", "p50 ms", "p99 ms", "avg batch", "queue us", "compute us",
            "errors", "within budget"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        r, s = row.result, row.result.server if row.result else None
        cells = [
            "**chosen**" if row is chosen else "",
            f"`{row.config.name}`",
            str(row.concurrency),
            _f(r.infer_per_s, 1) if r else "-",
            _f(r.p(50)) if r else "-",
            _f(r.p(99)) if r else "-",
            _f(s.avg_batch) if s else "-",
            _f(s.queue_us, 0) if s else "-",
            _f(s.compute_us, 0) if s else "-",
            (str(r.error_count) if r else row.error) or "0",
            "yes" if row.qualifies(budget_ms) else "no",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_comparison(rows: Sequence[Row], out_dir: Path, budget_ms: float) -> list[Path]:
    """p99 against throughput with a line per configuration, and the best in-budget throughput per configuration."""
    plt = loadgen.pyplot()
    configs = list(dict.fromkeys(r.config for r in rows))
    fig, ax = plt.subplots(figsize=(8, 5))
    for config in configs:
        points = [r for r in rows if r.config == config and r.result is not None and r.result.requests]
        if points:
            ax.plot([p.result.infer_per_s for p in points], [p.result.p(99) for p in points],  # type: ignore[union-attr]
                    marker="o", label=config.name)  # fmt: skip
    ax.axhline(budget_ms, color="red", linestyle="--", linewidth=1, label=f"p99 budget {budget_ms:g} ms")
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("p99 latency against throughput, one line per configuration (points: concurrency levels)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    latency_png = out_dir / "latency_vs_throughput.png"
    fig.savefig(latency_png, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(configs) + 1.5))
    best = []
    for config in configs:
        fits = [r.result.infer_per_s for r in rows if r.config == config and r.qualifies(budget_ms)]  # type: ignore[union-attr]
        best.append(max(fits, default=0.0))
    ax.barh([c.name for c in configs], best, color="tab:blue")
    ax.set_xlabel(f"best throughput with p99 <= {budget_ms:g} ms (infer/s)")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    bars_png = out_dir / "throughput_by_config.png"
    fig.savefig(bars_png, dpi=100)
    plt.close(fig)
    return [latency_png, bars_png]


def write_outputs(
    out_dir: Path, rows: Sequence[Row], chosen: Row | None, budget_ms: float, repository: Path, model: str,
    command: str,
) -> None:  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    table = [r.as_row() for r in rows]
    fields = list(dict.fromkeys(k for row in table for k in row))
    with (out_dir / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(table)
    (out_dir / "results.json").write_text(
        json.dumps(
            {
                "model": model,
                "latency_budget_ms": budget_ms,
                "chosen": None if chosen is None else {**chosen.config.as_dict(), "concurrency": chosen.concurrency},
                "rows": [
                    {**r.config.as_dict(), "concurrency": r.concurrency, "error": r.error,
                     "result": r.result.as_dict() if r.result else None}
                    for r in rows
                ],
            },
            indent=2,
        )
        + "\n"
    )  # fmt: skip
    pngs = plot_comparison(rows, out_dir, budget_ms)
    for config in dict.fromkeys(r.config for r in rows):
        results = [r.result for r in rows if r.config == config and r.result is not None and r.result.requests]
        if results:
            path = out_dir / f"config_{config.name}.png"
            loadgen.plot(results, path, title=f"{model} {config.name}")
            pngs.append(path)
    if chosen is not None:
        config = apply(read_config(repository / model), chosen.config)
        (out_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        verdict = (
            f"Chosen: **`{chosen.config.name}`** at concurrency {chosen.concurrency}: "
            f"{chosen.result.infer_per_s:,.1f} infer/s, p99 {chosen.result.p(99):.2f} ms "  # type: ignore[union-attr]
            f"(budget {budget_ms:g} ms). Its configuration is `config.pbtxt` beside this report."
        )
    else:
        (out_dir / "config.pbtxt").unlink(missing_ok=True)
        verdict = f"**No configuration qualifies**: none had a p99 within {budget_ms:g} ms without errors."
    report = [
        f"# Configuration sweep of `{model}`",
        "",
        f"Command: `{command}`",
        "",
        verdict,
        "",
        markdown_table(rows, chosen, budget_ms),
        "",
        "Latency in milliseconds (client side); avg batch, queue and compute (input + infer + output) from the "
        "server's statistics over the measured windows.",
        "",
        *(f"![{p.stem}]({p.name})\n" for p in pngs),
    ]
    (out_dir / "report.md").write_text("\n".join(report))


# ---------------------------------------------------------------------------------------------------------
# command line


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers, not {text!r}") from None


def _preferred(text: str) -> tuple[int, ...]:
    return () if text in ("", "none") else tuple(_ints(text))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--instance-count", type=_ints, default=[1])
    p.add_argument("--max-batch-size", type=_ints, default=[8])
    p.add_argument("--max-queue-delay-us", type=_ints, default=[0])
    p.add_argument("--preferred-batch-size", type=_preferred, action="append",
                   help="a set such as 4,8 (repeat for several sets; 'none' for no preference)")  # fmt: skip
    p.add_argument("--concurrency", type=_ints, default=[1, 4, 16])
    p.add_argument("--latency-budget-ms", type=float, required=True, help="p99 latency budget")
    p.add_argument("--input-data", default="random")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup-seconds", type=float, default=1.0)
    p.add_argument("--window-seconds", type=float, default=2.0)
    p.add_argument("--stability-percentage", type=float, default=10.0)
    p.add_argument("--max-windows", type=int, default=5)
    p.add_argument("--windows", type=int, help="a fixed number of windows per point")
    p.add_argument("-o", "--output-dir", type=Path, required=True)
    p.add_argument("--quiet", "-q", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    points = grid(args.instance_count, args.max_batch_size, args.max_queue_delay_us, args.preferred_batch_size or [()])
    if not points:
        print("sweep: the grid is empty (preferred batch sizes above every max batch size?)", file=sys.stderr)
        return 2
    if not (args.model_repository / args.model).is_dir():
        print(f"sweep: no folder {args.model} in {args.model_repository}", file=sys.stderr)
        return 2
    load = loadgen.Load(
        warmup_s=args.warmup_seconds, window_s=args.window_seconds, stability_pct=args.stability_percentage,
        max_windows=args.max_windows, windows=args.windows,
    )  # fmt: skip
    inputs = loadgen.InputSpec(args.input_data, dict(loadgen.parse_shape(s) for s in args.shape), args.batch_size)
    progress = None if args.quiet else loadgen.ProgressLine()
    rows: list[Row] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sweep-") as work:
        for k, point in enumerate(points, 1):
            print(f"sweep: [{k}/{len(points)}] {point.name}: starting modelsvc", file=sys.stderr, flush=True)
            found = measure_config(
                args.model_repository, args.model, point, args.concurrency, load, inputs, Path(work), progress
            )
            for row in found:
                r = row.result
                state = row.error or f"{r.infer_per_s:,.0f} infer/s, p99 {r.p(99):.2f} ms"  # type: ignore[union-attr]
                print(f"sweep: [{k}/{len(points)}] {point.name} c={row.concurrency}: {state}", file=sys.stderr)
            rows.extend(found)
    chosen = choose(rows, args.latency_budget_ms)
    command = "python -m loadtests.sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    write_outputs(args.output_dir, rows, chosen, args.latency_budget_ms, args.model_repository, args.model, command)
    print(markdown_table(rows, chosen, args.latency_budget_ms))
    took = time.monotonic() - started
    print(f"\n{len(points)} configurations x {len(args.concurrency)} concurrencies in {took:.0f} s")
    print(f"report: {args.output_dir / 'report.md'}")
    if chosen is None:
        print(f"sweep: no configuration meets p99 <= {args.latency_budget_ms:g} ms", file=sys.stderr)
        return 1
    print(f"chosen: {chosen.config.name} at concurrency {chosen.concurrency} -> {args.output_dir / 'config.pbtxt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
