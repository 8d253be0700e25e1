"""``python -m loadtests.loadgen``: the command line of the load generator (flags named as perf_analyzer's)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtests.loadgen import (
    InputSpec,
    Load,
    LoadgenError,
    ProgressLine,
    Target,
    format_table,
    parse_shape,
    plot,
    sweep,
    write_csv,
    write_json,
)


def parse_range(text: str, kind: type[int] | type[float]) -> list[float]:
    """perf_analyzer's ``start:end:step`` (end included; step 1 when left out)."""
    parts = [kind(p) for p in text.split(":")]
    if not 1 <= len(parts) <= 3 or parts[0] <= 0:
        raise argparse.ArgumentTypeError(f"want start[:end[:step]], not {text!r}")
    start, end, step = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else 1
    if step <= 0 or end < start:
        raise argparse.ArgumentTypeError(f"want start <= end and step > 0 in {text!r}")
    out, value = [], start
    while value <= end + 1e-9:
        out.append(value)
        value += step
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.loadgen", description=__doc__)
    t = p.add_argument_group("target")
    t.add_argument("--url", "-u", required=True, help="http://host:8000, grpc://host:8001, or a REST route with --rest")
    t.add_argument(
        "--model", "-m", default="", help="model name (v2 targets; with --rest, the model whose stats to read)"
    )
    t.add_argument("--model-version", "-x", default="")
    t.add_argument("--rest", action="store_true", help="POST JSON bodies from --input-data to the URL itself")
    t.add_argument("--stats-url", default="", help="modelsvc HTTP base URL to read --model's statistics from (REST)")
    i = p.add_argument_group("inputs")
    i.add_argument("--input-data", default="random", help="random, zero, or FILE.json (perf_analyzer's format)")
    i.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 for inputs with -1 dims (repeatable)")
    i.add_argument("--batch-size", "-b", type=int, default=1)
    load = p.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, help="closed loop: requests outstanding (default 1)")
    mode.add_argument("--concurrency-range", help="start:end:step, a closed-loop sweep")
    mode.add_argument("--request-rate", type=float, help="open loop: requests/s with Poisson arrivals")
    mode.add_argument("--request-rate-range", help="start:end:step, an open-loop sweep")
    load.add_argument("--warmup-seconds", type=float, default=1.0)
    load.add_argument("--window-seconds", type=float, default=5.0, help="measurement interval (default 5)")
    load.add_argument("--stability-percentage", "-s", type=float, default=10.0)
    load.add_argument("--max-windows", type=int, default=10, help="give up on stability after this many windows")
    load.add_argument("--windows", type=int, help="measure exactly this many windows (no stability check)")
    load.add_argument("--timeout-seconds", type=float, default=30.0, help="per request")
    load.add_argument("--max-inflight", type=int, default=1024, help="open loop: drop requests beyond this")
    out = p.add_argument_group("output")
    out.add_argument("--csv", "-f", type=Path)
    out.add_argument("--json", type=Path)
    out.add_argument("--plot", type=Path, help="PNG: latency percentiles against throughput")
    out.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    return p


def loads_from(args: argparse.Namespace) -> list[Load]:
    common = {
        "warmup_s": args.warmup_seconds, "window_s": args.window_seconds,
        "stability_pct": args.stability_percentage, "max_windows": args.max_windows, "windows": args.windows,
        "timeout_s": args.timeout_seconds, "max_inflight": args.max_inflight,
    }  # fmt: skip
    if args.request_rate is not None:
        return [Load(request_rate=args.request_rate, **common)]
    if args.request_rate_range:
        return [Load(request_rate=r, **common) for r in parse_range(args.request_rate_range, float)]
    if args.concurrency_range:
        return [Load(concurrency=int(c), **common) for c in parse_range(args.concurrency_range, int)]
    return [Load(concurrency=args.concurrency or 1, **common)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        loads = loads_from(args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    target = Target(args.url, args.model, args.model_version, args.rest, args.stats_url)
    try:
        inputs = InputSpec(args.input_data, dict(parse_shape(s) for s in args.shape), args.batch_size)
        results = sweep(target, loads, inputs, None if args.quiet else ProgressLine())
    except LoadgenError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"*** {target.protocol} {target.url} {target.model} batch {args.batch_size}, {args.input_data} data")
    print(format_table(results))
    if args.csv:
        write_csv(results, args.csv)
    if args.json:
        write_json(results, args.json)
    if args.plot:
        plot(results, args.plot)
    return 0 if all(r.requests for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
