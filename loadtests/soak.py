"""Soak (issue 17, part 3): the doc_classifier pair at a steady share of its capacity for a given time.

    python -m loadtests.soak                                  # 10 minutes at 70% of a measured capacity
    python -m loadtests.soak --minutes 10 --load 0.7 --capacity 4.2 --interval-s 60 --json soak.json
    python -m loadtests.soak --url http://127.0.0.1:8080 --model-pid 123 --logic-pid 124   # a running pair

Open-loop load (loadtests/harness/_openloop.py: one ~1,500-word document per request, Poisson arrivals); every
interval a row for both halves: 2xx req/s, ok, errors, p50 and p99 of the requests answered in the interval, RSS, open
descriptors and threads of each half (the process and its children, from /proc), and the load generator's own
CPU. Verdicts, comparing the end with the end of the first interval: RSS grew less than 5% (each half), no more
descriptors, no more threads, no error. Exit status 1 when a verdict fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from loadtests.harness._openloop import (
    OpenLoop,
    Record,
    add_load_arguments,
    capacity_of,
    check_load_arguments,
    markdown_table,
    ms,
    percentile,
    ramp_table,
    request_bodies,
    write_json,
)
from loadtests.harness._pair_procs import (
    Pair,
    ProcStats,
    add_pair_arguments,
    check_pair_arguments,
    own_cpu_seconds,
    own_sockets,
    pair_from,
)
from loadtests.harness._pair_procs import proc_stats as stats_of

RSS_GROWTH_MAX = 0.05

HEADER = [
    "minute", "req/s", "ok", "errors", "p50 ms", "p99 ms", "RSS MiB model", "RSS MiB logic",
    "fds model", "fds logic", "threads model", "threads logic", "gen conns", "gen CPU %",
]  # fmt: skip


@dataclass
class Interval:
    end_s: float
    seconds: float
    records: list[Record]
    model: ProcStats
    logic: ProcStats
    gen_cpu_s: float
    gen_sockets: int

    @property
    def ok(self) -> int:
        return sum(r.kind == "2xx" for r in self.records)

    def row(self) -> list[object]:
        lat = [r.latency_s for r in self.records if r.kind == "2xx"]
        return [
            f"{self.end_s / 60:.2f}", f"{self.ok / self.seconds:.2f}", self.ok, len(self.records) - self.ok,
            ms(percentile(lat, 50)), ms(percentile(lat, 99)),
            f"{self.model.rss_mib:.0f}", f"{self.logic.rss_mib:.0f}", self.model.fds, self.logic.fds,
            self.model.threads, self.logic.threads, self.gen_sockets, f"{100 * self.gen_cpu_s / self.seconds:.1f}",
        ]  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        errors: dict[str, int] = {}
        for r in self.records:
            if r.kind != "2xx":
                errors[r.kind] = errors.get(r.kind, 0) + 1
        lat = [r.latency_s for r in self.records if r.kind == "2xx"]
        return {
            "end_s": self.end_s, "seconds": self.seconds, "ok": self.ok, "errors": errors,
            "p50_ms": percentile(lat, 50) * 1000 if lat else None,
            "p99_ms": percentile(lat, 99) * 1000 if lat else None,
            "model": self.model.as_dict(), "logic": self.logic.as_dict(), "generator_cpu_s": self.gen_cpu_s,
            "generator_sockets": self.gen_sockets,
        }  # fmt: skip


def verdicts(intervals: list[Interval]) -> list[tuple[str, bool, str]]:
    """(what, held, the figures) for each target, the end against the end of the first interval."""
    first, last = intervals[0], intervals[-1]
    out = []
    for half in ("model", "logic"):
        a, b = getattr(first, half), getattr(last, half)
        growth = (b.rss_mib - a.rss_mib) / a.rss_mib if a.rss_mib else 0.0
        out.append((f"{half}: RSS growth after the first interval < 5%", growth < RSS_GROWTH_MAX,
                    f"{a.rss_mib:.0f} -> {b.rss_mib:.0f} MiB ({100 * growth:+.1f}%)"))  # fmt: skip
        if half == "model":
            out.append((f"{half}: no growth in open descriptors", b.fds <= a.fds, f"{a.fds} -> {b.fds}"))
        else:  # less one per connection the generator holds open to it
            fa, fb = a.fds - first.gen_sockets, b.fds - last.gen_sockets
            out.append((f"{half}: no growth in open descriptors, less the generator's connections", fb <= fa,
                        f"{a.fds} - {first.gen_sockets} -> {b.fds} - {last.gen_sockets}"))  # fmt: skip
        out.append((f"{half}: no growth in threads", b.threads <= a.threads, f"{a.threads} -> {b.threads}"))
    errors = sum(len(i.records) - i.ok for i in intervals)
    total = sum(len(i.records) for i in intervals)
    kinds: dict[str, int] = {}
    for i in intervals:
        for kind, n in i.as_dict()["errors"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    what = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    figures = f"{errors} of {total} requests" + (f": {what}" if what else "")
    out.append(("no errors", errors == 0 and total > 0, figures))
    return out


async def soak(pair: Pair, generator: OpenLoop, rate: float, seconds: float, interval_s: float) -> list[Interval]:
    """Run the load, printing a row at the end of each interval; the last interval also holds the answers that
    came after the load stopped."""
    intervals: list[Interval] = []
    sending = asyncio.create_task(generator.run(lambda _t: rate, seconds))
    await asyncio.sleep(0)  # run() has set generator.t0
    loop = asyncio.get_running_loop()
    taken, cpu, k = 0, own_cpu_seconds(), 1
    print(markdown_table(HEADER, []), flush=True)
    while True:
        end = min(k * interval_s, seconds)
        last = end >= seconds
        if last:
            await sending
        else:
            await asyncio.sleep(max(0.0, generator.t0 + end - loop.time()))
        now = loop.time() - generator.t0
        mine = generator.records[taken:]
        taken = len(generator.records)
        cpu_now = own_cpu_seconds()
        length = end - (k - 1) * interval_s
        intervals.append(Interval(max(now, end) if last else end, length, mine, stats_of(pair.model_pid),
                                  stats_of(pair.logic_pid), cpu_now - cpu, own_sockets()))  # fmt: skip
        cpu = cpu_now
        print(markdown_table(HEADER, [intervals[-1].row()]).splitlines()[-1], flush=True)
        if last:
            return intervals
        k += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (10)")
    parser.add_argument("--load", type=float, default=0.7, help="the share of the capacity sent (0.7)")
    parser.add_argument("--interval-s", type=float, default=60.0, help="seconds per row (60)")
    add_load_arguments(parser)
    add_pair_arguments(parser)
    args = parser.parse_args(argv)
    check_load_arguments(parser, args)
    check_pair_arguments(parser, args)
    if not args.minutes > 0 or not args.load > 0 or not args.interval_s > 0:
        parser.error("--minutes, --load and --interval-s must be positive")
    seconds = args.minutes * 60
    if args.interval_s > seconds:
        parser.error(f"--interval-s ({args.interval_s:g}) is longer than the run ({seconds:g} s)")
    bodies = request_bodies(args.words)
    with pair_from(args) as pair:
        capacity, ramp = capacity_of(args, pair.url, bodies)
        if ramp:
            print(ramp_table(ramp))
        rate = args.load * capacity
        print(f"\nsoak: {args.minutes:g} min at {args.load:g} x {capacity:.2f} = {rate:.2f} req/s, "
              f"{'fixed' if args.fixed else 'Poisson'} arrivals, {args.words}-word documents, "
              f"rows every {args.interval_s:g} s\n", flush=True)  # fmt: skip
        generator = OpenLoop(pair.url, bodies, poisson=not args.fixed, lost_s=args.lost_s, seed=args.seed)
        start_cpu, start_model, start_logic = own_cpu_seconds(), stats_of(pair.model_pid), stats_of(pair.logic_pid)
        intervals = asyncio.run(soak(pair, generator, rate, seconds, args.interval_s))
    wall = intervals[-1].end_s
    gen_cpu = own_cpu_seconds() - start_cpu
    model_cpu = intervals[-1].model.cpu_s - start_model.cpu_s
    logic_cpu = intervals[-1].logic.cpu_s - start_logic.cpu_s
    lags = [r.lag_s for i in intervals for r in i.records]
    print(f"\nCPU over the run, % of one core: model {100 * model_cpu / wall:.0f}, "
          f"logic {100 * logic_cpu / wall:.0f}, load generator {100 * gen_cpu / wall:.1f}; "
          f"generator's send lag p99 {ms(percentile(lags, 99))} ms\n")  # fmt: skip
    results = verdicts(intervals)
    print(markdown_table(["verdict", "held", "figures"], [[w, "yes" if ok else "NO", f] for w, ok, f in results]))
    write_json(args.json, {
        "script": "soak", "minutes": args.minutes, "load": args.load, "capacity": capacity, "rate": rate,
        "words": args.words, "interval_s": args.interval_s, "pair_started": pair.started,
        "ramp": [s.__dict__ for s in ramp], "intervals": [i.as_dict() for i in intervals],
        "cpu_share": {"model": model_cpu / wall, "logic": logic_cpu / wall, "generator": gen_cpu / wall},
        "verdicts": [{"what": w, "held": ok, "figures": f} for w, ok, f in results],
    })  # fmt: skip
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
