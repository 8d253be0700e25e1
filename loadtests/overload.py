"""Overload (issue 17, part 1): the doc_classifier pair at 70%, then 300%, then 70% of its capacity again.

    python -m loadtests.overload                              # capacity measured first, 30 s per phase
    python -m loadtests.overload --capacity 4.2 --phase-s 30 --json overload.json
    python -m loadtests.overload --capacity 4.2 --deadline-s 1.0          # each request sends Request-Timeout: 1.0
    python -m loadtests.overload --url http://127.0.0.1:8080 --model-pid 123 --logic-pid 124   # a running pair

Open-loop load (loadtests/harness/_openloop.py: one ~1,500-word document per request, Poisson arrivals), the phases back
to back, so the recovery phase starts with whatever the overload left behind. Requests count in the phase in which
they were due. Per phase: sent, what became of them (2xx, 503, 429, 504, other status, transport error, lost =
no answer within --lost-s), p50 and p99 of the 2xx latencies, p99 of the 503s' latency (from the time due, and
from the time the generator sent it: the server's part, without the generator's own lag), and how many 503s
carried Retry-After. Verdicts (issue 17): nothing lost; every answer 2xx, 503 or 429; p99 of 2xx at 300% within 2x
of the first 70% phase; 503s answered in under 10 ms (p99, from send); Retry-After on every 503; the recovery
phase's p99 within 1.5x of the first phase's. Exit status 1 when a verdict fails.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from loadtests.harness._openloop import (
    KINDS,
    OpenLoop,
    Record,
    add_load_arguments,
    capacity_of,
    check_load_arguments,
    deadline_headers,
    markdown_table,
    ms,
    percentile,
    ramp_table,
    request_bodies,
    run_open_loop,
    write_json,
)
from loadtests.harness._pair_procs import (
    add_pair_arguments,
    check_pair_arguments,
    own_cpu_seconds,
    pair_from,
    proc_stats,
)

PHASES = (("70%", 0.7), ("300%", 3.0), ("70% again", 0.7))
HEADER = [
    "phase", "req/s sent", "sent", *KINDS, "2xx/s", "p50 2xx ms", "p99 2xx ms", "p99 503 ms", "p99 503 ms from send",
    "Retry-After on 503",
]  # fmt: skip


def phase_summary(name: str, factor: float, rate: float, seconds: float, records: list[Record]) -> dict[str, Any]:
    counts = {k: sum(r.kind == k for r in records) for k in KINDS}
    ok = [r.latency_s for r in records if r.kind == "2xx"]
    refused = [r for r in records if r.kind == "503"]
    return {
        "phase": name, "factor": factor, "rate": rate, "seconds": seconds, "sent": len(records), "counts": counts,
        "ok_per_s": counts["2xx"] / seconds,
        "p50_2xx_s": percentile(ok, 50), "p99_2xx_s": percentile(ok, 99),
        "p99_503_s": percentile([r.latency_s for r in refused], 99),
        "p99_503_sent_s": percentile([r.latency_s - r.lag_s for r in refused], 99),
        "retry_after_503": sum(r.retry_after for r in refused),
        "lag_p99_s": percentile([r.lag_s for r in records], 99),
    }  # fmt: skip


def phase_row(p: dict[str, Any]) -> list[object]:
    return [
        p["phase"], f"{p['rate']:.2f}", p["sent"], *(p["counts"][k] for k in KINDS), f"{p['ok_per_s']:.2f}",
        ms(p["p50_2xx_s"]), ms(p["p99_2xx_s"]), ms(p["p99_503_s"]), ms(p["p99_503_sent_s"]),
        f"{p['retry_after_503']}/{p['counts']['503']}",
    ]  # fmt: skip


def verdicts(phases: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """(what, held or None when it cannot apply, the figures)."""
    first, over, again = phases
    lost = sum(p["counts"]["lost"] + p["counts"]["transport"] for p in phases)
    sent = sum(p["sent"] for p in phases)
    others = sum(p["counts"][k] for p in phases for k in ("504", "other"))
    refused = sum(p["counts"]["503"] for p in phases)
    with_retry = sum(p["retry_after_503"] for p in phases)
    p99_503 = percentile([v for v in (over["p99_503_s"], first["p99_503_s"], again["p99_503_s"]) if v == v], 100)
    sent_503 = [p.get("p99_503_sent_s", float("nan")) for p in phases]
    p99_503_sent = percentile([v for v in sent_503 if v == v], 100)

    def ratio(a: float, b: float) -> str:
        return f"{ms(a)} ms vs {ms(b)} ms ({a / b:.2f}x)" if a == a and b == b and b > 0 else "no 2xx to compare"

    return [
        ("nothing lost (an answer for every request, no transport error)", lost == 0, f"{lost} of {sent}"),
        ("every answer 2xx, 503 or 429", others == 0, f"{others} others (504, other statuses)"),
        ("p99 of 2xx at 300% <= 2x p99 at 70%", over["p99_2xx_s"] <= 2 * first["p99_2xx_s"],
         ratio(over["p99_2xx_s"], first["p99_2xx_s"])),
        ("503s answered in < 10 ms (p99, from send)", None if not refused else p99_503_sent < 0.010,
         f"p99 {ms(p99_503_sent)} ms from send ({ms(p99_503)} ms from due) over {refused} 503s"
         if refused else "no 503s"),
        ("Retry-After on every 503", None if not refused else with_retry == refused, f"{with_retry}/{refused}"),
        ("recovery: p99 of 2xx within 1.5x of the first phase", again["p99_2xx_s"] <= 1.5 * first["p99_2xx_s"],
         ratio(again["p99_2xx_s"], first["p99_2xx_s"])),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds per phase (30)")
    parser.add_argument("--deadline-s", type=float, help="send the caller's deadline with every request")
    parser.add_argument(
        "--deadline-header", choices=("request-timeout", "grpc-timeout"), default="request-timeout",
        help="how --deadline-s is sent: Request-Timeout: 1.0 (default) or grpc-timeout: 1000m",
    )  # fmt: skip
    add_load_arguments(parser)
    add_pair_arguments(parser)
    args = parser.parse_args(argv)
    check_load_arguments(parser, args)
    check_pair_arguments(parser, args)
    if not args.phase_s > 0:
        parser.error("--phase-s must be positive")
    if args.deadline_s is not None and not args.deadline_s > 0:
        parser.error("--deadline-s must be a positive number of seconds")
    bodies = request_bodies(args.words)
    headers = deadline_headers(args.deadline_s, args.deadline_header)
    with pair_from(args) as pair:
        capacity, ramp = capacity_of(args, pair.url, bodies)
        if ramp:
            print(ramp_table(ramp))
        rates = [factor * capacity for _, factor in PHASES]
        sent_with = ", ".join(f"{k}: {v}" for k, v in headers.items()) or "no deadline header"
        print(f"\noverload: capacity {capacity:.2f} req/s; phases of {args.phase_s:g} s at "
              f"{', '.join(f'{r:.2f}' for r in rates)} req/s; {'fixed' if args.fixed else 'Poisson'} arrivals, "
              f"{args.words}-word documents, {sent_with}; lost after {args.lost_s:g} s\n", flush=True)  # fmt: skip
        generator = OpenLoop(pair.url, bodies, headers, poisson=not args.fixed, lost_s=args.lost_s, seed=args.seed)
        start = own_cpu_seconds(), proc_stats(pair.model_pid), proc_stats(pair.logic_pid)

        def rate(t: float) -> float:
            return rates[min(len(rates) - 1, int(t // args.phase_s))]

        run_open_loop(generator, rate, args.phase_s * len(PHASES))
        end = own_cpu_seconds(), proc_stats(pair.model_pid), proc_stats(pair.logic_pid)
    wall = max([args.phase_s * len(PHASES), *(r.done for r in generator.records)])
    phases = [
        phase_summary(name, factor, rates[i], args.phase_s,
                      [r for r in generator.records if i * args.phase_s <= r.due < (i + 1) * args.phase_s])
        for i, (name, factor) in enumerate(PHASES)
    ]  # fmt: skip
    print(markdown_table(HEADER, [phase_row(p) for p in phases]))
    cpu = {
        "generator": end[0] - start[0], "model": end[1].cpu_s - start[1].cpu_s, "logic": end[2].cpu_s - start[2].cpu_s,
    }  # fmt: skip
    print(f"\nCPU over {wall:.0f} s, % of one core: model {100 * cpu['model'] / wall:.0f}, logic "
          f"{100 * cpu['logic'] / wall:.0f}, load generator {100 * cpu['generator'] / wall:.1f}; generator's send lag "
          f"p99 {ms(percentile([r.lag_s for r in generator.records], 99))} ms; the last answer "
          f"{wall - args.phase_s * len(PHASES):.1f} s after the load stopped\n")  # fmt: skip
    results = verdicts(phases)
    labels = {True: "yes", False: "NO", None: "n/a"}
    print(markdown_table(["verdict", "held", "figures"], [[w, labels[ok], f] for w, ok, f in results]))
    write_json(args.json, {
        "script": "overload", "capacity": capacity, "phase_s": args.phase_s, "words": args.words,
        "headers": headers, "pair_started": pair.started, "ramp": [s.__dict__ for s in ramp], "phases": phases,
        "cpu_seconds": cpu, "wall_s": wall,
        "verdicts": [{"what": w, "held": ok, "figures": f} for w, ok, f in results],
    })  # fmt: skip
    return 0 if all(ok is not False for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
