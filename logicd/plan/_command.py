"""The ``logicd plan`` command: arguments in (parsed by ``logicd._cli._main``, so that other commands never
import this package), table / JSON / picture / values out; exit 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys

from . import EXAMPLES, PlanError, as_json, example_plan, plan_file, render_svg, render_text, write_values

__all__ = ["command"]


def _fail(message: str) -> int:
    print(f"logicd plan: {message}", file=sys.stderr)
    return 2


def command(args: argparse.Namespace) -> int:
    if args.example is not None:
        if args.example not in EXAMPLES:
            return _fail(f"--example {args.example!r}: the examples are {', '.join(EXAMPLES)}")
        sys.stdout.write(example_plan(args.example))
        return 0
    if args.plan is None:
        return _fail("give PLAN.yaml (`logicd plan --example > plan.yaml` writes one to start from)")
    if args.picture is not None and args.picture.suffix.lower() != ".svg":
        return _fail(f"--picture writes SVG: name a .svg file, not {args.picture}")
    try:
        planned = plan_file(args.plan)
        if args.write_values is not None:
            from ._values import values_option

            values_option(planned, args.values_option)  # refused before anything is written
    except PlanError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(as_json(planned), indent=2))
    else:
        sys.stdout.write(render_text(planned, details=not args.summary))
    err = sys.stderr if args.json else sys.stdout
    if args.picture is not None:
        args.picture.parent.mkdir(parents=True, exist_ok=True)
        args.picture.write_text(render_svg(planned), encoding="utf-8")
        print(f"picture: {args.picture}", file=err)
    if args.write_values is not None:
        try:
            written, notes = write_values(planned, args.write_values, args.plan.name, args.values_option)
        except PlanError as exc:
            return _fail(str(exc))
        for path in written:
            print(f"values: {path}", file=err)
        for note in notes:
            print(f"  {note}", file=err)
    return 0
