"""The ``logicd plan`` command: arguments in (parsed by ``logicd._cli._main``, so that other commands never
import this package), table / JSON / picture / values out; exit 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys

from . import PlanError, as_json, example_plan, plan_file, render_svg, render_text, write_values

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    if args.example:
        sys.stdout.write(example_plan())
        return 0
    if args.plan is None:
        print(
            "logicd plan: give PLAN.yaml (`logicd plan --example > plan.yaml` writes one to start from)",
            file=sys.stderr,
        )
        return 2
    if args.picture is not None and args.picture.suffix.lower() != ".svg":
        print(f"logicd plan: --picture writes SVG: name a .svg file, not {args.picture}", file=sys.stderr)
        return 2
    try:
        planned = plan_file(args.plan)
    except PlanError as exc:
        print(f"logicd plan: {exc}", file=sys.stderr)
        return 2
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
        written, skipped = write_values(planned, args.write_values, args.plan.name)
        for path in written:
            print(f"values: {path}", file=err)
        for why in skipped:
            print(f"values not written for {why}", file=err)
    return 0
