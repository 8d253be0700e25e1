"""A long fuzz run: the properties CI runs briefly (tests/loadtests/test_fuzz_protocol.py,
tests/loadtests/test_fuzz_modelsvc_live.py, tests/loadtests/test_fuzz_services.py), each with many more examples, and
a table of what each found.

    python -m loadtests.fuzz --examples 2000                       # the v2 decoders, in this process
    python -m loadtests.fuzz --examples 500 --modelsvc             # + a real modelsvc over HTTP and gRPC
    python -m loadtests.fuzz --examples 300 --service all          # + both example services (schemathesis)

A failure does not stop a target: every failing example is counted, failures are grouped by kind (exception type
and where it was raised), and the smallest example of each kind is printed after the table. Warnings are errors,
as in the test suite (numpy's overflow warnings are how a wrapped value shows). The exit status is 1 if anything
failed. ``--seed`` makes a run repeatable.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings

from loadtests.fuzz import _h2 as _fuzz_h2
from loadtests.fuzz import _protocol as _fuzz_protocol
from loadtests.fuzz._protocol import Target

_PROJECT = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    name: str
    examples: int = 0
    failures: int = 0
    kinds: dict[str, tuple[int, str]] = field(default_factory=dict)
    """kind -> (how many, the shortest failing example's text)."""
    answers: Counter[str] = field(default_factory=Counter)
    """What became of the inputs that passed (decoded, refused, an HTTP status...), how many of each."""
    seconds: float = 0.0


def _kind(exc: BaseException) -> str:
    """An exception's type and the last line of this project that it passed through."""
    inner = getattr(exc, "exceptions", None)
    if inner:  # schemathesis' FailureGroup: the kinds of failure it holds
        return " + ".join(sorted({_kind(e) for e in inner}))
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith(str(_PROJECT)) and "/.venv/" not in frame.filename:
            where = f"{Path(frame.filename).relative_to(_PROJECT)}:{frame.lineno}"
    title = str(exc).strip().splitlines()[0][:80] if str(exc).strip() else ""
    return f"{type(exc).__name__} at {where}" + (f" ({title})" if type(exc).__name__ != "AssertionError" else "")


def run(target: Target, examples: int, seed_value: int | None) -> Outcome:
    outcome = Outcome(target.name)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=seed_value is None,
    )
    @given(target.strategy)
    def prop(case: Any) -> None:
        outcome.examples += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                outcome.answers[target.check(case)] += 1
        except Exception as exc:
            outcome.failures += 1
            kind = _kind(exc)
            text = repr(case)[:400]
            count, sample = outcome.kinds.get(kind, (0, text))
            outcome.kinds[kind] = (count + 1, min(sample, text, key=len))

    test = seed(seed_value)(prop) if seed_value is not None else prop
    start = time.perf_counter()
    test()
    outcome.seconds = time.perf_counter() - start
    return outcome


def _answers(answers: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in answers.most_common(5))


def table(outcomes: list[Outcome]) -> str:
    rows = [("target", "examples", "failures", "kinds", "seconds", "answers (passing examples)")]
    rows += [
        (o.name, str(o.examples), str(o.failures), str(len(o.kinds)), f"{o.seconds:.1f}", _answers(o.answers))
        for o in outcomes
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = (0, 5)  # the text columns; the numbers are right-aligned

    def line(row: tuple[str, ...]) -> str:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(cells) + " |"

    lines = [line(row) for row in rows]
    rule = ["-" * (w + 2) if i in left else "-" * (w + 1) + ":" for i, w in enumerate(widths)]
    lines.insert(1, "|" + "|".join(rule) + "|")
    return "\n".join(lines)


@contextlib.contextmanager
def _live_modelsvc() -> Iterator[list[Target]]:
    import grpc
    import httpx

    from loadtests.fuzz import _live as _fuzz_live

    with (
        _fuzz_live.embedder_modelsvc() as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        yield _fuzz_live.modelsvc_targets(server, client, channel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="examples per target (default 1000)")
    parser.add_argument("--service", choices=["doc_classifier", "embedder", "all"], help="fuzz the service's API")
    parser.add_argument("--modelsvc", action="store_true", help="fuzz a real modelsvc over HTTP and gRPC")
    parser.add_argument("--seed", type=int, help="a seed, for a repeatable run (default: derandomized)")
    parser.add_argument("--only", help="run only the targets whose name contains this")
    args = parser.parse_args(argv)

    outcomes: list[Outcome] = []

    def run_all(targets: list[Target]) -> None:
        for target in targets:
            if args.only and args.only not in target.name:
                continue
            outcomes.append(run(target, args.examples, args.seed))
            print(f"  {target.name}: {outcomes[-1].examples} examples, {outcomes[-1].failures} failures",
                  file=sys.stderr, flush=True)  # fmt: skip

    run_all(_fuzz_protocol.TARGETS + _fuzz_h2.TARGETS)
    if args.modelsvc:
        with _live_modelsvc() as targets:
            run_all(targets)
    if args.service:
        from loadtests.fuzz import _services as _fuzz_services

        for service in _fuzz_services.SERVICES if args.service == "all" else (args.service,):
            with _fuzz_services.embedded_service(service) as base_url:
                run_all(_fuzz_services.targets(service, base_url))

    print(table(outcomes))
    for outcome in outcomes:
        for kind, (count, sample) in outcome.kinds.items():
            print(f"\n{outcome.name}: {kind} x{count}\n  e.g. {sample}")
    return 1 if any(o.failures for o in outcomes) else 0
